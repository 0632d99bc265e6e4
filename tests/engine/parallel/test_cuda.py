"""The CUDA path: the engine and a group of ranks on GPUs. Skipped on a machine without CUDA
devices (the development machine has none); run on a lent GPU machine with
``pytest -m cuda tests/engine/parallel/test_cuda.py``."""

from __future__ import annotations

import pytest
import torch

from interlock.engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from interlock.engine.parallel.group import GroupRunner, rank_devices
from interlock.engine.runners.torch_runner import TorchRunner
from interlock.errors import ConfigError
from tests.engine.parallel.test_group import _run

DEVICES = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [pytest.mark.cuda, pytest.mark.skipif(DEVICES < 1, reason="no CUDA device on this machine")]


def _config(device: str, tensor: int = 1) -> EngineConfig:
    return EngineConfig(
        model=ModelConfig(device=device, dtype="float32", tensor_parallel_size=tensor),
        cache=CacheConfig(num_blocks=32),
        scheduler=SchedulerConfig(max_model_len=256),
    )


def test_the_engine_on_cuda_computes_what_it_does_on_the_cpu() -> None:
    cpu = _run(TorchRunner.from_config(_config("cpu")))
    gpu = _run(TorchRunner.from_config(_config("cuda")))
    assert [s for s, _ in gpu] == [s for s, _ in cpu]
    for (_, lp), (_, want) in zip(gpu, cpu, strict=True):
        assert all(abs(lp[r] - want[r]) < 1e-3 for r in lp)


@pytest.mark.skipif(DEVICES < 2, reason="tensor parallelism on CUDA needs two devices")
def test_two_ranks_on_two_devices_compute_what_one_does() -> None:
    one = _run(TorchRunner.from_config(_config("cuda")))
    runner = GroupRunner.from_config(_config("cuda", tensor=2))
    try:
        assert [s for s, _ in _run(runner)] == [s for s, _ in one]
    finally:
        runner.close()


def test_more_ranks_than_devices_are_refused_with_the_reason() -> None:
    with pytest.raises(ConfigError, match=f"needs {DEVICES + 1} CUDA devices from cuda:0, one a rank"):
        rank_devices("cuda", DEVICES + 1)
