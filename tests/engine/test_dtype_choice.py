"""The model dtype "auto": bf16 or fp32 by measurement, cached per machine (engine.model.dtype_choice)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from interlock.deploy import ExecutionGroup, _validate_group
from interlock.engine.config import EngineConfig, ModelConfig
from interlock.engine.model import dtype_choice
from interlock.engine.model.config import ModelArchConfig
from interlock.engine.runners.torch_runner import TorchRunner
from interlock.env import get_env
from interlock.errors import ConfigError
from interlock.model_store import resolve_model
from tests.engine.test_paged_kv_cache import ARCH as TINY

CPU = torch.device("cpu")
ARCH = replace(TINY, hidden_size=64, intermediate_size=128, num_layers=1, num_heads=4, head_dim=16)
"""Large enough for a measurement to mean something, small enough to take milliseconds."""


@pytest.mark.parametrize(
    ("name", "dtype"), [("bfloat16", torch.bfloat16), ("fp32", torch.float32), ("float16", torch.float16)]
)
def test_an_explicit_dtype_is_used_as_given(tmp_path: Path, name: str, dtype: torch.dtype) -> None:
    choice = dtype_choice.resolve(name, CPU, ARCH, cache_dir=tmp_path)
    assert choice.dtype == dtype and choice.ratio is None
    assert not (tmp_path / "dtype").exists()  # nothing measured


def test_an_unknown_dtype_is_refused_by_name_wherever_it_is_given(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'int3'.*auto, bfloat16"):
        dtype_choice.resolve("int3", CPU, ARCH, cache_dir=tmp_path)
    with pytest.raises(ConfigError, match="'int3'"):
        ModelConfig(dtype="int3")
    with pytest.raises(ConfigError, match="groups.0.dtype"):
        _validate_group(ExecutionGroup(dtype="int3"), "groups.0")


def test_the_mock_runner_takes_no_dtype() -> None:
    _validate_group(ExecutionGroup(runner="mock"), "g")
    with pytest.raises(ConfigError, match="mock runner has no dtype"):
        _validate_group(ExecutionGroup(runner="mock", dtype="float32"), "g")


def test_fp32_only_when_bf16_is_clearly_slower() -> None:
    m = dtype_choice.FP32_MARGIN
    assert dtype_choice._choice(m * 1.01, cached=False).dtype == torch.float32
    assert dtype_choice._choice(m * 0.99, cached=False).dtype == torch.bfloat16
    assert dtype_choice._choice(0.5, cached=True).dtype == torch.bfloat16
    assert "3.50x" in dtype_choice._choice(3.5, cached=False).why


def test_auto_on_the_plain_path_measures_once_then_reads_the_cache(tmp_path: Path) -> None:
    first = dtype_choice.resolve("auto", CPU, ARCH, cache_dir=tmp_path, fused=False)
    assert first.ratio is not None and first.ratio > 0 and "measured now" in first.why
    assert first.dtype == (torch.float32 if first.ratio > dtype_choice.FP32_MARGIN else torch.bfloat16)
    (cached,) = (tmp_path / "dtype").glob("*.json")
    again = dtype_choice.resolve("auto", CPU, ARCH, cache_dir=tmp_path, fused=False)
    assert again.dtype == first.dtype and again.ratio == first.ratio and "cached" in again.why
    cached.write_text("{not json")  # a damaged cache is measured again, not an error
    third = dtype_choice.resolve("auto", CPU, ARCH, cache_dir=tmp_path, fused=False)
    assert "measured now" in third.why


def test_another_model_shape_is_measured_for_itself(tmp_path: Path) -> None:
    dtype_choice.resolve("auto", CPU, ARCH, cache_dir=tmp_path, fused=False)
    dtype_choice.resolve("auto", CPU, replace(ARCH, intermediate_size=256), cache_dir=tmp_path, fused=False)
    assert len(list((tmp_path / "dtype").glob("*.json"))) == 2


def test_the_runner_loads_the_model_in_the_dtype_auto_picks() -> None:
    folder = resolve_model("smollm2")
    env = get_env()
    expected = dtype_choice.resolve(
        "auto", CPU, ModelArchConfig.from_folder(folder), cache_dir=env.cache_dir, fused=env.cpu_kernels
    )
    runner = TorchRunner.from_config(EngineConfig(model=ModelConfig(model="smollm2")))
    assert ModelConfig().dtype == "auto"
    assert runner.model.dtype == expected.dtype and runner.cache.tensor.dtype == expected.dtype


def _resolve_in_child(cache_dir: str) -> tuple[str, float | None]:
    choice = dtype_choice.resolve("auto", CPU, ARCH, cache_dir=Path(cache_dir), fused=False)
    return choice.why, choice.ratio


def test_workers_starting_together_measure_once_and_agree(tmp_path: Path) -> None:
    import multiprocessing as mp

    with mp.get_context("spawn").Pool(2) as pool:
        got = pool.map(_resolve_in_child, [str(tmp_path)] * 2)
    assert sorted("measured now" in why for why, _ in got) == [False, True]
    assert got[0][1] == got[1][1]
