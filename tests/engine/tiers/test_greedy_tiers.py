"""Greedy fp32 output of the real model (SmolLM2) is the same whether a prefix was computed,
found in the device pool, loaded back from the host tier or the disk tier, or loaded from the
host tier another worker shares."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
import torch

from interlock.engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from interlock.engine.core import EngineCore
from interlock.engine.model import LlamaModel
from interlock.engine.runners.torch_runner import TorchRunner
from interlock.engine.tiers.shared import segment_path
from interlock.model_store import resolve_model
from interlock.protocol import GenerateRequest, SamplingParams
from tests.engine.conftest import run_to_end, tokens

CHAT = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3717, 314, 20389, 7018, 28, 7018, 2,
        198, 1, 4093, 198]
QUESTIONS = [[19556, 30, 2, 198, 1, 520, 9531, 198], [2683, 359, 253, 30, 2, 198, 1, 520, 9531, 198]]
BS = 16


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    return LlamaModel.load(resolve_model("smollm2", progress=False), torch.float32, torch.device("cpu"), 512)


def engine(model: LlamaModel, *, host: int | None, disk: int | None = None, path: Path | None = None,
           shared: str | None = None) -> EngineCore:
    config = EngineConfig(
        model=ModelConfig(runner="torch", dtype="float32"),
        cache=CacheConfig(block_size=BS, num_blocks=14, watermark=0.0, host_kv_blocks=host,
                          disk_kv_blocks=disk, disk_kv_path=str(path) if path else None,
                          host_kv_shared=shared),
        scheduler=SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=4, max_model_len=512),
    )
    return EngineCore(config, TorchRunner(model, num_blocks=14, block_size=BS))


def prompt(i: int) -> list[int]:
    """A long shared-looking history (about 6 blocks) that differs per i from its 2nd block on."""
    history = CHAT + [(17 + i * 3 + k) % 5000 + 300 for k in range(70)]
    return history + QUESTIONS[i % 2]


def generate(core: EngineCore, rid: str, p: list[int]) -> tuple[list[int], int]:
    """Run one request to its end; first let the tier thread finish its writes (a lookup only
    finds a block on disk once its file is written)."""
    deadline = time.monotonic() + 30
    while core.tiers is not None and core.tiers.has_pending():
        assert time.monotonic() < deadline
        core.step()
        time.sleep(0.001)
    core.add_request(GenerateRequest(request_id=rid, token_ids=tuple(p),
                                     sampling=SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)))
    outs = run_to_end(core, each_step=lambda _: time.sleep(0.0005) if core.scheduler.loading else None)
    return tokens(outs[rid]), outs[rid][-1].num_cached_tokens


def loads(core: EngineCore) -> dict[str, int]:
    return {s.tier: s.loads for s in core.load.kv_tiers}


def test_greedy_output_is_the_same_from_every_tier(model: LlamaModel, tmp_path: Path) -> None:
    p = prompt(0)
    plain = EngineCore(EngineConfig(model=ModelConfig(runner="torch", dtype="float32"),
                                    cache=CacheConfig(block_size=BS, num_blocks=14, enable_prefix_caching=False),
                                    scheduler=SchedulerConfig(max_num_batched_tokens=256, max_model_len=512)),
                       TorchRunner(model, num_blocks=14, block_size=BS))
    computed, _ = generate(plain, "c", p)

    host_engine = engine(model, host=16)
    assert generate(host_engine, "a", p) == (computed, 0)
    assert generate(host_engine, "device", p)[0] == computed  # device-pool hit
    for i in (1, 2):  # push p's blocks out of the 14-block pool
        generate(host_engine, f"x{i}", prompt(i))
    out, cached = generate(host_engine, "host", p)
    assert out == computed and cached == 96 and loads(host_engine)["host"] > 0
    host_engine.close()

    disk_engine = engine(model, host=1, disk=32, path=tmp_path)
    generate(disk_engine, "a", p)
    for i in (1, 2):
        generate(disk_engine, f"x{i}", prompt(i))
    out, cached = generate(disk_engine, "disk", p)
    assert out == computed and cached == 96 and loads(disk_engine)["disk"] > 0
    disk_engine.close()

    name = f"test-greedy-{uuid.uuid4().hex[:10]}"
    try:
        first, second = engine(model, host=16, shared=name), engine(model, host=16, shared=name)
        generate(first, "a", p)
        for i in (1, 2, 3):  # other first blocks too: all of p leaves first's pool
            generate(first, f"x{i}", [t + 1 for t in prompt(i)])
        first.step()
        out, cached = generate(second, "other worker", p)  # second never saw p
        assert out == computed and cached == 96 and loads(second)["host"] > 0
        first.close()
        second.close()
    finally:
        for suffix in ("", ".lock"):
            Path(str(segment_path(name)) + suffix).unlink(missing_ok=True)
