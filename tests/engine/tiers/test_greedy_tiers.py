"""Greedy fp32 output of the real model (SmolLM2) is the same whether a prefix was computed,
found in the device pool, loaded back from the host tier or the disk tier, or loaded from the
host tier another worker shares."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
import torch

from interlock import kvhash
from interlock.engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from interlock.engine.core import EngineCore
from interlock.engine.model import LlamaModel
from interlock.engine.runners.torch_runner import TorchRunner
from interlock.engine.tiers.shared import segment_path
from interlock.model_store import resolve_model
from interlock.protocol import GenerateRequest, SamplingParams
from tests.engine.conftest import run_to_end, tokens

CHAT = [
    1,
    9690,
    198,
    2683,
    359,
    253,
    5356,
    5646,
    11173,
    3365,
    3717,
    314,
    20389,
    7018,
    28,
    7018,
    2,
    198,
    1,
    4093,
    198,
]
BS = 16
POOL = 8


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    return LlamaModel.load(resolve_model("smollm2", progress=False), torch.float32, torch.device("cpu"), 256)


def engine(
    model: LlamaModel,
    *,
    host: int | None,
    disk: int | None = None,
    path: Path | None = None,
    shared: str | None = None,
) -> EngineCore:
    config = EngineConfig(
        model=ModelConfig(runner="torch", dtype="float32"),
        cache=CacheConfig(
            block_size=BS,
            num_blocks=POOL,
            watermark=0.0,
            host_kv_blocks=host,
            disk_kv_blocks=disk,
            disk_kv_path=str(path) if path else None,
            host_kv_shared=shared,
        ),
        scheduler=SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=4, max_model_len=256),
    )
    return EngineCore(config, TorchRunner(model, num_blocks=POOL, block_size=BS))


def prompt(i: int) -> list[int]:
    """71 tokens (4 full blocks and a bit); prompts for different i share no block."""
    return (
        [(17 + i * 1000 + k * 7) % 40000 + 300 for k in range(2 * i)]
        + CHAT
        + [(17 + i * 3 + k) % 5000 + 300 for k in range(50 - 2 * i)]
    )


def generate(core: EngineCore, rid: str, p: list[int]) -> tuple[list[int], int]:
    """Run one request to its end; first let the tier thread finish its writes (a lookup only
    finds a block on disk once its file is written)."""
    deadline = time.monotonic() + 30
    while core.tiers is not None and core.tiers.has_pending():
        assert time.monotonic() < deadline
        core.step()
        time.sleep(0.001)
    core.add_request(
        GenerateRequest(
            request_id=rid,
            token_ids=tuple(p),
            sampling=SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True),
        )
    )
    outs = run_to_end(core, each_step=lambda _: time.sleep(0.0005) if core.scheduler.loading else None)
    return tokens(outs[rid]), outs[rid][-1].num_cached_tokens


def loads(core: EngineCore) -> dict[str, int]:
    return {s.tier: s.loads for s in core.load.kv_tiers}


def push_out(core: EngineCore) -> None:
    """Two other prompts (5 blocks each) take the whole 8-block pool."""
    for i in (1, 2):
        generate(core, f"x{i}", prompt(i))


def test_greedy_output_is_the_same_from_every_tier(model: LlamaModel, tmp_path: Path) -> None:
    p = prompt(0)
    name = f"test-greedy-{uuid.uuid4().hex[:10]}"
    try:
        first = engine(model, host=16, shared=name)
        computed, cached = generate(first, "computed", p)
        assert cached == 0
        assert generate(first, "device", p) == (computed, 64)
        push_out(first)
        assert all(first.pool.get_cached_block(h) is None for h in kvhash.hash_blocks(p, BS))
        assert generate(first, "host", p) == (computed, 64) and loads(first)["host"] == 4
        second = engine(model, host=16, shared=name)  # another worker of the host: never saw p
        assert generate(second, "other worker", p) == (computed, 64) and loads(second)["host"] == 4
        first.close()
        second.close()
    finally:
        for suffix in ("", ".lock"):
            Path(str(segment_path(name)) + suffix).unlink(missing_ok=True)

    disk_engine = engine(model, host=1, disk=32, path=tmp_path)
    generate(disk_engine, "computed", p)
    push_out(disk_engine)
    assert generate(disk_engine, "disk", p) == (computed, 64)
    assert loads(disk_engine)["disk"] >= 2
    disk_engine.close()
