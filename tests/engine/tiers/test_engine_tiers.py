"""The engine with KV tiers below its pool (mock runner, virtual clock, manual tier I/O)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from interlock import kvhash
from interlock.engine.clock import VirtualClock
from interlock.engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from interlock.engine.core import EngineCore
from interlock.engine.request import RequestStatus
from interlock.engine.runners.mock import MockRunner, reference_output
from interlock.engine.tiers import ManualIO
from interlock.engine.tiers.shared import segment_path
from interlock.errors import ConfigError
from interlock.protocol import BlockRemoved, BlockStored
from interlock.protocol.kv_sync import stored_by_tier
from tests.engine.conftest import EOS, VOCAB, request, run_to_end, tokens

BS = 4


def tiered_engine(
    io: ManualIO,
    *,
    num_blocks: int = 16,
    host: int | None = 8,
    disk: int | None = None,
    path: Path | None = None,
    shared: str | None = None,
) -> EngineCore:
    config = EngineConfig(
        model=ModelConfig(runner="mock"),
        cache=CacheConfig(
            num_blocks=num_blocks,
            block_size=BS,
            watermark=0.0,
            host_kv_blocks=host,
            disk_kv_blocks=disk,
            disk_kv_path=str(path) if path else None,
            host_kv_shared=shared,
        ),
        scheduler=SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8, max_model_len=256),
    )
    runner = MockRunner(
        num_blocks=num_blocks, block_size=BS, vocab_size=VOCAB, eos_token_ids=(EOS,), timing=None
    )
    return EngineCore(config, runner, clock=VirtualClock(), tier_io=io)


def run(engine: EngineCore, io: ManualIO, rid: str, prompt: list[int], max_tokens: int = 3) -> list[int]:
    engine.add_request(request(rid, prompt, max_tokens))
    outs = run_to_end(engine, each_step=lambda _: io.run_pending())
    assert outs[rid][-1].finish_reason == "length"
    return tokens(outs[rid])


def prompt(seed: int, n: int = 21) -> list[int]:
    return [(seed * 131 + i * 7) % (VOCAB - 10) + 10 for i in range(n)]


def push_out(engine: EngineCore, io: ManualIO, n: int = 3) -> list[int]:
    """Run a prompt, then ``n`` others that push its blocks out of the pool; returns it."""
    a = prompt(1)
    assert run(engine, io, "a1", a) == reference_output(a, 3, vocab_size=VOCAB)
    for i in range(n):
        run(engine, io, f"x{i}", prompt(10 + i))
    return a


def test_an_evicted_prefix_comes_back_from_host_with_the_same_output() -> None:
    io = ManualIO()
    engine = tiered_engine(io)
    a = push_out(engine, io)
    engine.step()
    host = engine.tiers.host  # type: ignore[union-attr]
    assert host is not None and len(host) > 0
    engine.add_request(request("a2", a, 3))
    outs = run_to_end(engine, each_step=lambda _: io.run_pending())
    assert tokens(outs["a2"]) == reference_output(a, 3, vocab_size=VOCAB)
    assert outs["a2"][-1].num_cached_tokens == 20  # all 5 full blocks, from host and device
    stats = {s.tier: s for s in engine.load.kv_tiers}
    assert stats["host"].loads > 0 and stats["host"].hits == stats["host"].loads


def test_a_loading_request_holds_no_slot_and_the_loop_goes_on() -> None:
    io = ManualIO()
    engine = tiered_engine(io)
    a = push_out(engine, io)
    engine.add_request(request("a2", a, 3))
    engine.add_request(request("b", prompt(50), 3))
    engine.step()  # a2 parks for its load; b runs
    s = engine.scheduler
    assert "a2" in s.loading and s.requests["a2"].status == RequestStatus.WAITING_FOR_REMOTE_KV
    assert [r.request_id for r in s.running] == ["b"]
    for _ in range(5):
        engine.step()  # the copy has not run: a2 stays parked, b goes on
    assert "a2" in s.loading and io.pending
    io.run_pending()
    outs = run_to_end(engine, each_step=lambda _: io.run_pending())
    assert tokens(outs["a2"]) == reference_output(a, 3, vocab_size=VOCAB)


def test_abort_during_a_load_frees_the_blocks_only_when_the_copy_ends() -> None:
    io = ManualIO()
    engine = tiered_engine(io)
    a = push_out(engine, io)
    engine.add_request(request("a2", a, 3))
    engine.step()
    assert "a2" in engine.scheduler.loading
    assert engine.abort("a2")
    engine.step()
    assert "a2" in engine.scheduler.orphans and engine.kv.has_blocks("a2")
    engine.check_integrity()
    engine.add_request(request("a2", a, 3))  # the id is still taken by the running copy
    assert engine.step().outputs[0].error is not None
    io.run_pending()
    engine.step()
    assert not engine.scheduler.orphans and not engine.kv.has_blocks("a2")
    assert engine.pool.num_used_blocks == 0
    engine.check_integrity()


def test_host_spills_to_disk_and_disk_loads_back(tmp_path: Path) -> None:
    io = ManualIO()
    engine = tiered_engine(io, host=2, disk=32, path=tmp_path)
    a = push_out(engine, io, 4)
    engine.step()
    disk = engine.tiers.disk  # type: ignore[union-attr]
    assert disk is not None and len(disk) > 0 and any(tmp_path.glob("slot-0/*.kv"))
    engine.add_request(request("a2", a, 3))
    outs = run_to_end(engine, each_step=lambda _: io.run_pending())
    assert tokens(outs["a2"]) == reference_output(a, 3, vocab_size=VOCAB)
    assert outs["a2"][-1].num_cached_tokens == 20
    stats = {s.tier: s for s in engine.load.kv_tiers}
    assert stats["disk"].loads > 0 and stats["disk"].load_failures == 0
    engine.close()


def test_a_corrupt_disk_block_is_computed_again(tmp_path: Path) -> None:
    io = ManualIO()
    engine = tiered_engine(io, host=None, disk=32, path=tmp_path)
    a = push_out(engine, io)
    engine.step()
    io.run_pending()
    engine.step()
    for f in tmp_path.glob("slot-0/*.kv"):  # corrupt every file's last byte
        raw = bytearray(f.read_bytes())
        raw[-1] ^= 1
        f.write_bytes(raw)
    engine.add_request(request("a2", a, 3))
    outs = run_to_end(engine, each_step=lambda _: io.run_pending())
    assert tokens(outs["a2"]) == reference_output(a, 3, vocab_size=VOCAB)
    stats = {s.tier: s for s in engine.load.kv_tiers}
    assert stats["disk"].load_failures == 1 and stats["disk"].loads == 0
    engine.close()


def test_tier_events_and_snapshot_name_the_tier() -> None:
    io = ManualIO()
    engine = tiered_engine(io, host=2)
    events = []
    run(engine, io, "a1", prompt(1))
    for i in range(3):
        engine.add_request(request(f"x{i}", prompt(10 + i), 3))
        for _ in range(20):
            events += engine.step().kv_events
            io.run_pending()
    host_events = [e for e in events if isinstance(e, (BlockStored, BlockRemoved)) and e.tier == "host"]
    assert any(isinstance(e, BlockStored) for e in host_events)
    assert any(isinstance(e, BlockRemoved) for e in host_events)  # 2 slots: it evicted
    snap = engine.kv_snapshot()
    held = {e.block_hashes[0] for e in snap if isinstance(e, BlockStored) and e.tier == "host"}
    assert held == set(engine.tiers.host.hashes())  # type: ignore[union-attr]
    state = engine.kv_state()  # what a router's pull sends: the same blocks, hashes by tier
    assert {t: sorted(h) for t, h in state.items()} == {t: sorted(h) for t, h in stored_by_tier(snap).items()}
    assert "host" in state


@pytest.fixture
def shared_name() -> Iterator[str]:
    name = f"test-{uuid.uuid4().hex[:12]}"
    yield name
    for suffix in ("", ".lock"):
        Path(str(segment_path(name)) + suffix).unlink(missing_ok=True)


def test_a_prefix_one_worker_computed_is_loaded_by_another_through_the_shared_tier(
    shared_name: str,
) -> None:
    io_a, io_b = ManualIO(), ManualIO()
    a = tiered_engine(io_a, shared=shared_name)
    b = tiered_engine(io_b, shared=shared_name)
    p = push_out(a, io_a)
    a.step()
    assert b.tiers is not None and b.tiers.lookup(kvhash.hash_blocks(p, BS)) > 0  # b computed nothing
    b.add_request(request("p", p, 3))
    outs = run_to_end(b, each_step=lambda _: io_b.run_pending())
    assert tokens(outs["p"]) == reference_output(p, 3, vocab_size=VOCAB)
    assert outs["p"][-1].num_cached_tokens > 0
    assert {s.tier: s.loads for s in b.load.kv_tiers}["host"] > 0
    a.close()
    b.close()


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"host_kv_gib": -1.0}, "host_kv_gib must be >= 0"),
        ({"host_kv_gib": 1.0, "host_kv_blocks": 4}, "not both"),
        ({"disk_kv_blocks": 4}, "needs disk_kv_path"),
        ({"disk_kv_path": "/tmp/x"}, "has no size"),
        ({"host_kv_blocks": 4, "enable_prefix_caching": False}, "need prefix caching"),
        ({"host_kv_shared": "x"}, "needs a host tier"),
        ({"host_kv_blocks": 4, "host_kv_shared": "../etc"}, "use letters"),
    ],
)
def test_bad_tier_config_is_refused_by_name(kw: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        CacheConfig(**kw)  # type: ignore[arg-type]
