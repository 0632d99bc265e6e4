"""A router pulls its workers' KV state (``router/kv_sync.py``, ``engine/kv_sync.py``): a joining
worker's whole cache over the request plane in compact parts, nothing pushed on the event plane;
a gap in the event stream replayed from the worker's ring, only the gap; a gap past the ring one
snapshot; a few pulls at a time however many workers join; a large state applied in slices."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Generator

import pytest

from interlock.engine.kv_sync import KvEventLog, KvSyncServer
from interlock.engine.serving import FakeEngine
from interlock.engine.worker import Worker, WorkerOptions
from interlock.errors import TransportError
from interlock.protocol import InstanceInfo, subjects
from interlock.router.indexer import STATE_STEP
from interlock.router.kv_sync import MAX_PULLS, StateApplier
from interlock.router.service import RouterService
from interlock.runtime import InProcRegistry, RuntimeConfig, connect_runtime
from interlock.runtime.runtime import Runtime

CFG = RuntimeConfig(heartbeat_interval=0.05, lease_timeout=2.0)
BLOCK = 16
_ids = itertools.count(1)


def chain(n: int) -> list[int]:
    """``n`` new block hashes (64-bit, distinct across calls)."""
    return [(next(_ids) * 0x9E3779B97F4A7C15) & (2**64 - 1) for _ in range(n)]


class LossyEvents:
    """The worker's event plane, dropping its KV batches while ``dropping`` (a lost message)."""

    def __init__(self, inner) -> None:  # type: ignore[no-untyped-def]
        self.inner, self.dropping, self.dropped = inner, False, 0

    async def publish(self, subject: str, payload: bytes) -> None:
        if self.dropping and subject.startswith("interlock.kv."):
            self.dropped += 1
            return
        await self.inner.publish(subject, payload)

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self.inner, name)


def make_worker(
    wid: str, engine: FakeEngine, rt: Runtime, ring: int | None = None
) -> tuple[Worker, LossyEvents]:
    events = LossyEvents(rt.events)
    info = InstanceInfo(
        instance_id=wid,
        endpoint=subjects.GENERATE_ENDPOINT,
        model="m",
        block_size=BLOCK,
        kv_blocks_total=engine.kv_blocks_total,
    )
    w = Worker(
        engine, info, discovery=rt.discovery, requests=rt.requests, events=events, options=WorkerOptions()
    )  # type: ignore[arg-type]
    if ring is not None:
        w.kv_log = KvEventLog(max_batches=ring)
        w.kv_sync = KvSyncServer(w.engine, w.kv_log)
    return w, events


async def settle(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not check():
            await asyncio.sleep(0.01)


def run(body: Callable[[Runtime, RouterService, list[bytes]], Awaitable[None]]) -> None:
    async def main() -> None:
        registry = InProcRegistry()
        rt = await connect_runtime(None, CFG, registry=registry)
        svc = RouterService(discovery=rt.discovery, requests=rt.requests, events=rt.events)
        asked: list[bytes] = []  # resync requests on the event plane: the old push
        sub = await rt.events.subscribe(subjects.resync("*"))

        async def count(s: AsyncIterator[tuple[str, bytes]]) -> None:
            async for _, payload in s:
                asked.append(payload)

        counter = asyncio.create_task(count(sub))
        await svc.start()
        try:
            await body(rt, svc, asked)
        finally:
            counter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await counter
            await svc.close()
            await rt.close()
            registry.leases.close()

    asyncio.run(main())


def run_with_runtime(body: Callable[[Runtime], Awaitable[None]]) -> None:
    """``body`` on a fresh in-process runtime of its own registry, closed after."""

    async def main() -> None:
        registry = InProcRegistry()
        rt = await connect_runtime(None, CFG, registry=registry)
        try:
            await body(rt)
        finally:
            await rt.close()
            registry.leases.close()

    asyncio.run(main())


def indexed(svc: RouterService, wid: str) -> frozenset[int]:
    router = svc.routers.get("m")
    if router is None or wid not in router.workers():
        return frozenset()
    return router.indexer.blocks_of(wid)


def stored(engine: FakeEngine) -> frozenset[int]:
    return frozenset(engine._stored)


@pytest.mark.timeout(60)
def test_a_joining_worker_s_cache_is_pulled_in_compact_parts_and_nothing_is_pushed() -> None:
    async def body(rt: Runtime, svc: RouterService, asked: list[bytes]) -> None:
        engine = FakeEngine(block_size=BLOCK, num_blocks=100_000)
        engine.fill(chain(40_000), announce=False)  # cached before the router hears of it
        w, _ = make_worker("w", engine, rt)
        await w.start()
        await settle(lambda: indexed(svc, "w") == stored(engine) and not svc.kv_sync.syncing)
        stats = svc.kv_sync.stats
        assert (stats.snapshots, stats.replays, stats.failed, stats.snapshot_blocks) == (1, 0, 0, 40_000)
        assert stats.bytes / 40_000 < 10  # block hashes only: about 9 bytes a block
        assert asked == []  # no resync asked on the event plane, so no snapshot published there
        engine.fill(chain(3))  # live events continue from the snapshot's seq
        await settle(lambda: indexed(svc, "w") == stored(engine) and not svc.kv_sync.syncing)
        assert (stats.snapshots, stats.replays) == (1, 0)
        await w.drain(0.0)

    run(body)


@pytest.mark.timeout(60)
def test_a_gap_inside_the_ring_replays_only_the_gap() -> None:
    async def body(rt: Runtime, svc: RouterService, asked: list[bytes]) -> None:
        engine = FakeEngine(block_size=BLOCK, num_blocks=100_000)
        engine.fill(chain(500), announce=False)
        w, events = make_worker("w", engine, rt)
        await w.start()
        await settle(lambda: indexed(svc, "w") == stored(engine) and not svc.kv_sync.syncing)
        events.dropping = True
        for _ in range(5):
            engine.fill(chain(4))  # five batches the router never hears
        await settle(lambda: events.dropped == 5)
        events.dropping = False
        engine.fill(chain(4))  # the sixth arrives: the router sees the gap
        await settle(lambda: indexed(svc, "w") == stored(engine) and not svc.kv_sync.syncing)
        stats = svc.kv_sync.stats
        assert (stats.snapshots, stats.replays, stats.replayed_batches) == (1, 1, 6)
        assert w.kv_sync.replays == 1 and w.kv_sync.snapshots == 1
        assert asked == []
        await w.drain(0.0)

    run(body)


@pytest.mark.timeout(60)
def test_a_gap_past_the_ring_costs_one_snapshot() -> None:
    async def body(rt: Runtime, svc: RouterService, asked: list[bytes]) -> None:
        engine = FakeEngine(block_size=BLOCK, num_blocks=100_000)
        w, events = make_worker("w", engine, rt, ring=3)
        await w.start()
        engine.fill(chain(8))
        await settle(lambda: indexed(svc, "w") == stored(engine) and not svc.kv_sync.syncing)
        events.dropping = True
        for _ in range(5):
            engine.fill(chain(4))
        await settle(lambda: events.dropped == 5)
        events.dropping = False
        engine.fill(chain(4))
        await settle(lambda: indexed(svc, "w") == stored(engine) and not svc.kv_sync.syncing)
        stats = svc.kv_sync.stats
        assert (stats.snapshots, stats.replays) == (2, 0)
        assert asked == []
        await w.drain(0.0)

    run(body)


@pytest.mark.timeout(90)
def test_many_joining_workers_are_pulled_a_few_at_a_time() -> None:
    async def body(rt: Runtime, svc: RouterService, asked: list[bytes]) -> None:
        running = peak = 0
        stream = rt.requests.stream

        def counted(address: str, payload: bytes):  # type: ignore[no-untyped-def]
            async def gen() -> AsyncIterator[bytes]:
                nonlocal running, peak
                running += 1
                peak = max(peak, running)
                try:
                    async for frame in stream(address, payload):
                        await asyncio.sleep(0.005)  # a slow link: pulls overlap
                        yield frame
                finally:
                    running -= 1

            return gen()

        svc.kv_sync._requests = type("Counted", (), {"stream": staticmethod(counted)})()  # type: ignore[assignment]
        engines = {}
        for i in range(16):
            engines[f"w{i}"] = e = FakeEngine(block_size=BLOCK, num_blocks=100_000)
            e.fill(chain(2000), announce=False)
        workers = [make_worker(wid, e, rt)[0] for wid, e in engines.items()]
        await asyncio.gather(*(w.start() for w in workers))
        # A pull counts as done once its stream ends, a moment after its last batch is applied.
        await settle(
            lambda: (
                svc.kv_sync.syncing == 0 and all(indexed(svc, wid) == stored(e) for wid, e in engines.items())
            ),
            30.0,
        )
        assert svc.kv_sync.stats.snapshots == 16
        assert 1 < peak <= MAX_PULLS
        await asyncio.gather(*(w.drain(0.0) for w in workers))

    run(body)


def test_the_ring_keeps_the_last_batches_within_its_bounds() -> None:
    log = KvEventLog(max_batches=3, max_bytes=10)
    assert log.since(None) is None and log.since(-1) == [] and log.since(0) is None
    for seq in range(5):
        log.append(seq, b"abc")
    assert log.since(4) == [] and log.since(3) == [b"abc"]
    assert log.since(2) == [b"abc", b"abc"] and log.since(1) == [b"abc"] * 3
    assert log.since(0) is None  # batch 1 left the ring
    log.append(5, b"0123456789")  # alone over the byte bound: it stays, the others go
    assert len(log) == 1 and log.since(4) == [b"0123456789"] and log.since(3) is None
    with pytest.raises(ValueError, match="contiguous"):
        log.append(7, b"x")


def _slow_consumers(monitor_port: int) -> int:
    import json
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{monitor_port}/varz", timeout=5) as r:
        return int(json.load(r)["slow_consumers"])


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_fleet_whose_snapshots_exceed_the_pending_bound_converges_without_a_disconnect() -> None:
    """16 workers x 4,096 cached blocks join a router on a real nats-server that cuts a client
    with more than 1 MiB unread: pulled over the request plane, nothing comes near the bound (the
    same caches pushed on the event plane at once, the old re-sync, cut the router in most runs:
    BENCHMARKS.md, data-centre scale, has the fleet figures)."""
    from interlock.runtime import NatsServer
    from tests.e2e.conftest import free_port

    monitor = free_port()
    with NatsServer(monitor_port=monitor, max_pending_bytes=1 << 20) as server:

        async def main() -> None:
            rt = await connect_runtime(server.url, CFG)
            svc = RouterService(discovery=rt.discovery, requests=rt.requests, events=rt.events)
            await svc.start()
            fleet = [await connect_runtime(server.url, CFG) for _ in range(16)]
            try:
                engines = {f"w{i}": FakeEngine(block_size=BLOCK, num_blocks=10_000) for i in range(16)}
                for e in engines.values():
                    e.fill(chain(4096), announce=False)
                workers = [
                    make_worker(wid, e, wrt)[0] for (wid, e), wrt in zip(engines.items(), fleet, strict=True)
                ]
                await asyncio.gather(*(w.start() for w in workers))
                await settle(
                    lambda: (
                        not svc.kv_sync.syncing
                        and all(indexed(svc, wid) == stored(e) for wid, e in engines.items())
                    ),
                    60.0,
                )
                assert svc.kv_sync.stats.snapshots == 16
                assert _slow_consumers(monitor) == 0
                assert rt.link is not None and rt.link.status().outages == 0
                await asyncio.gather(*(w.drain(0.0) for w in workers))
            finally:
                await svc.close()
                for r in (*fleet, rt):
                    await r.close()

        asyncio.run(main())


@pytest.mark.timeout(60)
def test_pulls_are_counted_in_the_metrics() -> None:
    async def body(rt: Runtime, svc: RouterService, asked: list[bytes]) -> None:
        engine = FakeEngine(block_size=BLOCK, num_blocks=10_000)
        engine.fill(chain(100), announce=False)
        w, _ = make_worker("w", engine, rt)
        await w.start()
        await settle(lambda: indexed(svc, "w") == stored(engine) and not svc.kv_sync.syncing)
        text = svc.prometheus_text()
        assert 'interlock_router_kv_syncs_total{kind="snapshot"} 1' in text
        assert 'interlock_router_kv_syncs_total{kind="replay"} 0' in text
        assert "interlock_router_kv_syncing_workers 0" in text
        assert f"interlock_router_kv_sync_bytes_total {svc.kv_sync.stats.bytes}" in text
        await w.drain(0.0)

    run(body)


@pytest.mark.timeout(60)
def test_a_large_pulled_state_is_applied_in_slices_with_turns_between() -> None:
    """30,000 blocks take several milliseconds to apply: other tasks (requests) run between
    its slices, and the worker counts as loading until the last."""

    async def body(rt: Runtime, svc: RouterService, asked: list[bytes]) -> None:
        engine = FakeEngine(block_size=BLOCK, num_blocks=100_000)
        engine.fill(chain(30_000), announce=False)
        worker, _ = make_worker("w0", engine, rt)
        mid_load = []
        done = asyncio.Event()

        async def ticker() -> None:
            while not done.is_set():
                await asyncio.sleep(0)
                router = svc.routers.get("m")
                if router is not None and 0 < router.indexer.num_blocks("w0") < 30_000:
                    mid_load.append(router.needs_resync())

        turns = asyncio.create_task(ticker())
        await worker.start()
        await settle(lambda: indexed(svc, "w0") == stored(engine) and not svc.kv_sync.syncing, 30.0)
        done.set()
        await turns
        assert len(mid_load) >= 30_000 // STATE_STEP - 1
        assert all(flagged == ["w0"] for flagged in mid_load)
        assert svc.routers["m"].needs_resync() == [] and svc.kv_sync.stats.snapshots == 1
        await worker.drain(0.0)

    run(body)


class _Turns:
    """Counts turns of the event loop (a callback that schedules itself again each turn)."""

    def __init__(self) -> None:
        self.now = 0
        self._loop = asyncio.get_running_loop()
        self._handle = self._loop.call_soon(self._tick)

    def _tick(self) -> None:
        self.now += 1
        self._handle = self._loop.call_soon(self._tick)

    def stop(self) -> None:
        self._handle.cancel()


def _slices(turns: _Turns, seen: list[int], n: int, fail_at: int = -1) -> Generator[None, None, None]:
    """A ``load_state`` of ``n`` slices noting the turn each one ran in."""
    for i in range(n):
        yield
        if i == fail_at:
            raise TransportError("a bad hash")
        seen.append(turns.now)


def test_states_pulled_together_are_applied_one_slice_per_turn_of_the_loop() -> None:
    async def main() -> list[int]:
        turns, seen = _Turns(), []
        applier = StateApplier()
        await asyncio.gather(*(applier.apply(_slices(turns, seen, 6)) for _ in range(4)))
        turns.stop()
        return seen

    seen = asyncio.run(main())
    # every request's step waits behind one slice, not one slice per pull running
    assert len(seen) == 24 and len(set(seen)) == 24


def test_a_failing_state_raises_in_its_pull_and_a_cancelled_one_stops() -> None:
    async def main() -> tuple[list[int], list[int], list[int]]:
        turns = _Turns()
        applier = StateApplier()
        bad, cut, good = [], [], []
        failing = asyncio.ensure_future(applier.apply(_slices(turns, bad, 10, fail_at=2)))
        cancelled = asyncio.ensure_future(applier.apply(_slices(turns, cut, 10**7)))
        fine = asyncio.ensure_future(applier.apply(_slices(turns, good, 5)))
        with pytest.raises(TransportError, match="a bad hash"):
            await failing
        await asyncio.sleep(0.01)
        cancelled.cancel()
        await fine
        applier.close()
        turns.stop()
        return bad, cut, good

    bad, cut, good = asyncio.run(main())
    assert len(bad) == 2 and 0 < len(cut) < 10**7 and len(good) == 5
