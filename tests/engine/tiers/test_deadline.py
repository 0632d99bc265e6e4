"""Load deadlines: a slow or hung disk costs its requests at most the deadline, never a failure
or a block written after it was given up (mock runner, manual tier I/O and a virtual clock; one
test with the real I/O thread blocked in a real read)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from interlock import kvhash
from interlock.engine.clock import RealClock, VirtualClock
from interlock.engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from interlock.engine.core import EngineCore
from interlock.engine.runners.mock import MockRunner, reference_output
from interlock.engine.tiers import ManualIO, ThreadIO, TierIO
from interlock.engine.tiers.deadline import Abandoned, CopyGuard, LoadDeadline
from interlock.engine.tiers.disk import block_path
from interlock.errors import ConfigError
from interlock.protocol import GenerateOutput, TierStats
from tests.engine.conftest import EOS, VOCAB, request, run_to_end, tokens
from tests.engine.tiers.test_engine_tiers import BS, prompt

# ---- the pieces ----


def test_the_deadline_is_a_floor_plus_the_bytes_at_the_slowest_rate() -> None:
    d = LoadDeadline(2.0, 50 * (1 << 20))
    assert d.seconds(0) == 2.0
    assert d.seconds(100 * (1 << 20)) == pytest.approx(4.0)
    with pytest.raises(ValueError, match="positive"):
        LoadDeadline(0.0, 1.0)


@pytest.mark.parametrize(
    "kw", [{"tier_load_timeout_s": 0.0}, {"tier_load_min_mib_s": -1.0}, {"tier_load_timeout_s": float("nan")}]
)
def test_a_bad_deadline_is_refused_by_name(kw: dict[str, float]) -> None:
    name = next(iter(kw))
    with pytest.raises(ConfigError, match=name):
        CacheConfig(**kw)  # type: ignore[arg-type]


def test_the_engine_config_sets_the_tiers_deadline(tmp_path: Path) -> None:
    engine = disk_engine(ManualIO(), tmp_path, clock=VirtualClock(), timeout_s=7.0)
    assert engine.tiers is not None
    assert engine.tiers.deadline == LoadDeadline(7.0, 50.0 * (1 << 20))
    engine.close()


def test_the_guard_abandons_only_between_copies_and_refuses_copies_after() -> None:
    g = CopyGuard()
    with g.copying():
        assert g.abandon() is None  # a copy runs: not now
        assert not g.abandoned
    g.arrived(2)
    assert g.abandon() == 2 and g.abandoned
    with pytest.raises(Abandoned), g.copying():
        raise AssertionError("a copy after abandon must not run")
    g.arrived(3)  # a late report changes nothing
    assert g.abandon() == 2


# ---- the engine ----


def disk_engine(
    io: TierIO, path: Path, *, clock: VirtualClock | RealClock, timeout_s: float = 2.0
) -> EngineCore:
    config = EngineConfig(
        model=ModelConfig(runner="mock"),
        cache=CacheConfig(
            num_blocks=16,
            block_size=BS,
            watermark=0.0,
            disk_kv_blocks=64,
            disk_kv_path=str(path),
            tier_load_timeout_s=timeout_s,
        ),
        scheduler=SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8, max_model_len=256),
    )
    runner = MockRunner(num_blocks=16, block_size=BS, vocab_size=VOCAB, eos_token_ids=(EOS,), timing=None)
    return EngineCore(config, runner, clock=clock, tier_io=io)


PROMPTS = [prompt(s) for s in range(1, 7)]


def spill(engine: EngineCore, drain: object) -> None:
    """Run every prompt once; the first ones end up on disk only (the pool holds 16 blocks)."""
    for i, p in enumerate(PROMPTS):
        engine.add_request(request(f"w{i}", p, 3))
        outs = run_to_end(engine, each_step=lambda _: drain())  # type: ignore[operator]
        assert tokens(outs[f"w{i}"]) == reference_output(p, 3, vocab_size=VOCAB)
    for _ in range(100):
        drain()  # type: ignore[operator]
        engine.step()
        if not engine.tiers.has_pending():  # type: ignore[union-attr]
            return
        time.sleep(0.001)
    raise AssertionError("disk writes did not finish")


def on_disk_only(engine: EngineCore, p: list[int]) -> bool:
    hashes = kvhash.hash_blocks(p, BS)
    disk = engine.tiers.disk  # type: ignore[union-attr]
    return engine.pool.get_cached_block(hashes[0]) is None and all(h in disk for h in hashes)


def disk_stats(engine: EngineCore) -> TierStats:
    return {s.tier: s for s in engine.load.kv_tiers}["disk"]


def kv_of(engine: EngineCore) -> np.ndarray:
    runner = engine.runner
    assert isinstance(runner, MockRunner)
    return runner.kv


def test_a_load_past_its_deadline_is_abandoned_and_its_late_copy_skipped(tmp_path: Path) -> None:
    io, clock = ManualIO(), VirtualClock()
    engine = disk_engine(io, tmp_path, clock=clock)
    spill(engine, io.run_pending)
    a, b = PROMPTS[0], PROMPTS[1]
    assert on_disk_only(engine, a) and on_disk_only(engine, b)
    tiers = engine.tiers
    assert tiers is not None

    engine.add_request(request("a2", a, 3))
    engine.step()
    assert "a2" in engine.scheduler.loading and io.pending
    table = list(engine.kv.block_table("a2"))
    clock.advance(1.0)
    engine.step()  # within the deadline: still waiting
    assert "a2" in engine.scheduler.loading
    clock.advance(60.0)
    first = engine.step().outputs  # past it: a2 computes its prompt; the job has not run
    assert "a2" not in engine.scheduler.loading and [o.request_id for o in first] == ["a2"]
    assert disk_stats(engine).load_timeouts == 5 and disk_stats(engine).loads == 0
    engine.check_integrity()  # the job's pins are still held, and accounted for

    # While the job is stuck nothing new is loaded from (or written to) the disk.
    queued = len(io.pending)
    assert tiers.lookup(kvhash.hash_blocks(b, BS)) == 0
    engine.add_request(request("b2", b, 3))
    outs = run_to_end(engine)  # the I/O stays stuck throughout
    assert tokens([*first, *outs["a2"]]) == reference_output(a, 3, vocab_size=VOCAB)
    assert tokens(outs["b2"]) == reference_output(b, 3, vocab_size=VOCAB)
    assert outs["b2"][-1].num_cached_tokens == 0 and disk_stats(engine).hits == 5
    assert len(io.pending) == queued and not tiers.has_pending()

    # The read ends at last, with good data: it must not land in blocks given up on.
    kv = kv_of(engine)
    saved = kv[table].copy()
    kv[table] = -7
    io.run_pending()
    assert (kv[table] == -7).all()
    kv[table] = saved
    engine.step()
    engine.check_integrity()
    assert engine.pool.num_used_blocks == 0 and tiers.disk is not None and tiers.disk.num_pinned == 0

    # And the tier works again.
    c = PROMPTS[2]
    assert on_disk_only(engine, c) and tiers.lookup(kvhash.hash_blocks(c, BS)) == 5
    engine.add_request(request("c2", c, 3))
    outs = run_to_end(engine, each_step=lambda _: io.run_pending())
    assert tokens(outs["c2"]) == reference_output(c, 3, vocab_size=VOCAB)
    assert outs["c2"][-1].num_cached_tokens == 20 and disk_stats(engine).loads == 5
    engine.close()


def test_a_load_done_in_time_is_used_even_if_seen_after_the_deadline(tmp_path: Path) -> None:
    io, clock = ManualIO(), VirtualClock()
    engine = disk_engine(io, tmp_path, clock=clock)
    spill(engine, io.run_pending)
    a = PROMPTS[0]
    engine.add_request(request("a2", a, 3))
    engine.step()
    assert "a2" in engine.scheduler.loading
    clock.advance(1.0)
    io.run_pending()
    clock.advance(60.0)  # the engine looks only now: the copy is done, so it counts
    outs = run_to_end(engine, each_step=lambda _: io.run_pending())
    assert tokens(outs["a2"]) == reference_output(a, 3, vocab_size=VOCAB)
    assert outs["a2"][-1].num_cached_tokens == 20
    stats = disk_stats(engine)
    assert stats.loads == 5 and stats.load_timeouts == 0
    engine.close()


def test_loads_queued_behind_a_stuck_one_are_given_up_with_it(tmp_path: Path) -> None:
    io, clock = ManualIO(), VirtualClock()
    engine = disk_engine(io, tmp_path, clock=clock)
    spill(engine, io.run_pending)
    a, b = PROMPTS[0], PROMPTS[1]
    engine.add_request(request("a2", a, 3))
    engine.step()
    engine.add_request(request("b2", b, 3))
    engine.step()
    assert set(engine.scheduler.loading) == {"a2", "b2"}
    clock.advance(2.5)  # past a2's deadline; b2's counts from a2's, so not past its own
    first = engine.step().outputs
    assert not engine.scheduler.loading
    assert disk_stats(engine).load_timeouts == 10
    outs = run_to_end(engine)
    for o in first:
        outs[o.request_id].insert(0, o)
    assert tokens(outs["a2"]) == reference_output(a, 3, vocab_size=VOCAB)
    assert tokens(outs["b2"]) == reference_output(b, 3, vocab_size=VOCAB)
    io.run_pending()
    engine.step()
    engine.check_integrity()
    assert engine.pool.num_used_blocks == 0
    engine.close()


def test_closing_does_not_wait_for_a_stuck_read(tmp_path: Path) -> None:
    """A worker shutting down with a hung disk must not hang too (the thread is a daemon)."""
    fifo = tmp_path / "hung"
    os.mkfifo(fifo)
    io, clock = ThreadIO(), VirtualClock()
    engine = disk_engine(io, tmp_path / "kv", clock=clock)
    spill(engine, lambda: None)
    stuck = io.submit(lambda: open(fifo, "rb").close())  # blocks until a writer opens the FIFO
    engine.add_request(request("a2", PROMPTS[0], 3))
    engine.step()
    assert "a2" in engine.scheduler.loading  # its copy queued behind the stuck job
    clock.advance(60.0)
    engine.step()
    assert "a2" not in engine.scheduler.loading
    try:
        engine.close()  # returns at once
        assert not stuck.done
    finally:
        assert _wait(lambda: _unblock(fifo))  # once the thread has reached the read
    assert stuck.wait(10)


def _unblock(fifo: Path, data: bytes = b"") -> bool:
    """Open the FIFO for writing (a reader blocked in open goes on), write ``data``, close."""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # no reader (yet)
        return False
    try:
        if data:
            os.write(fd, data)
    finally:
        os.close(fd)
    return True


def test_a_hung_disk_read_on_the_real_io_thread_costs_no_request(tmp_path: Path) -> None:
    """A real hang: the first block file the load reads is a FIFO, so the I/O thread's read
    blocks in ``open`` until the test writes the block's true bytes into it, after the
    request was served. Real clock, a 0.5 s floor."""
    io = ThreadIO()
    engine = disk_engine(io, tmp_path, clock=RealClock(), timeout_s=0.5)
    spill(engine, lambda: None)
    tiers, kv = engine.tiers, kv_of(engine)
    assert tiers is not None and tiers.disk is not None
    a, b, c = PROMPTS[0], PROMPTS[1], PROMPTS[2]
    assert on_disk_only(engine, a) and on_disk_only(engine, b) and on_disk_only(engine, c)
    path = block_path(tiers.disk.directory, kvhash.hash_blocks(a, BS)[0])
    good = path.read_bytes()
    path.unlink()
    os.mkfifo(path)
    try:
        outs, waited = serve(engine, "a2", a)
        assert tokens(outs["a2"]) == reference_output(a, 3, vocab_size=VOCAB)
        assert outs["a2"][-1].num_cached_tokens == 0 and waited >= 0.5
        assert disk_stats(engine).load_timeouts == 5
        # b is on disk too, but nothing is loaded while the read hangs: b computes at once.
        outs, _ = serve(engine, "b2", b)
        assert tokens(outs["b2"]) == reference_output(b, 3, vocab_size=VOCAB)
        assert outs["b2"][-1].num_cached_tokens == 0 and disk_stats(engine).hits == 5
        engine.check_integrity()
        # The read completes with the block's true bytes: the copy must still be skipped.
        # (the blocks a2 was loading into: it kept them, computed them, they are cached)
        table = [engine.pool.get_cached_block(h) for h in kvhash.hash_blocks(a, BS)]
        assert None not in table
        saved = kv[table].copy()
        kv[table] = -7
        assert _wait(lambda: _unblock(path, good))
        hashes_c = kvhash.hash_blocks(c, BS)
        assert _wait(lambda: engine.step() and tiers.lookup(hashes_c) == 5)  # no longer stuck
        assert (kv[table] == -7).all()
        kv[table] = saved
    finally:
        _unblock(path)  # never leave the I/O thread blocked
    engine.step()
    outs, _ = serve(engine, "c2", c)
    assert tokens(outs["c2"]) == reference_output(c, 3, vocab_size=VOCAB)
    assert outs["c2"][-1].num_cached_tokens == 20 and disk_stats(engine).loads == 5
    engine.check_integrity()
    assert engine.pool.num_used_blocks == 0 and tiers.disk.num_pinned == 0
    engine.close()


def serve(engine: EngineCore, rid: str, p: list[int]) -> tuple[dict[str, list[GenerateOutput]], float]:
    """Step (as the engine loop does: a short pause when nothing moved) until ``rid`` ends;
    the outputs and the seconds until its first token."""
    engine.add_request(request(rid, p, 3))
    outs: dict[str, list[GenerateOutput]] = {}
    t0 = time.monotonic()
    first = None
    while engine.has_unfinished():
        assert time.monotonic() - t0 < 30, "the request did not end"
        res = engine.step()
        engine.check_integrity()
        for o in res.outputs:
            outs.setdefault(o.request_id, []).append(o)
            first = first if first is not None else time.monotonic() - t0
        if not res.outputs:
            time.sleep(0.005)
    assert first is not None
    return outs, first


def _wait(ok: object, seconds: float = 10.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if ok():  # type: ignore[operator]
            return True
        time.sleep(0.005)
    return False
