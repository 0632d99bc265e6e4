"""A second router replica copies its index from a live one (``router/kv_replica.py``): the
workers are asked for nothing but gaps; a replica that cannot answer leaves it to the worker."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from interlock.engine.serving import FakeEngine
from interlock.protocol import AllBlocksCleared, BlockStored, KVEventBatch
from interlock.protocol.kv_sync import REPLICA_ID_PREFIX
from interlock.router.indexer import KvIndexer
from interlock.router.service import RouterService
from interlock.runtime.nats_permissions import worker_permissions
from tests.router.test_kv_sync import (
    BLOCK,
    chain,
    indexed,
    make_worker,
    run_with_runtime,
    settle,
    stored,
)


def test_export_is_a_worker_s_whole_state_by_tier_or_none() -> None:
    idx = KvIndexer(compiled=False)
    idx.add_worker("w")
    assert idx.export("w") is None  # nothing applied yet: no whole state
    assert idx.export("other") is None
    events = (
        AllBlocksCleared(),
        BlockStored(block_hashes=(1, 2, 3), parent_block_hash=None),
        BlockStored(block_hashes=(7, 8), parent_block_hash=None, tier="host"),
        BlockStored(block_hashes=(8, 9), parent_block_hash=None, tier="disk"),
    )
    idx.apply(KVEventBatch(instance_id="w", seq=4, timestamp=0.0, events=events, snapshot=True))
    seq, tiers = idx.export("w") or (None, {})
    assert seq == 4
    assert {t: sorted(h) for t, h in tiers.items()} == {"device": [1, 2, 3], "host": [7, 8], "disk": [8, 9]}
    idx.apply(KVEventBatch(instance_id="w", seq=6, timestamp=0.0, events=()))  # a gap: 5 lost
    assert idx.export("w") is None  # waiting for a snapshot: not a whole state


def test_the_index_counts_the_workers_whose_state_is_loading() -> None:
    idx = KvIndexer(compiled=False)
    idx.add_worker("a")
    idx.add_worker("b")
    idx.add_worker("approx", publishes_events=False)
    assert idx.loading == 2  # joined: waiting for their snapshots
    snap = KVEventBatch(instance_id="a", seq=0, timestamp=0.0, events=(AllBlocksCleared(),), snapshot=True)
    idx.apply(snap)
    assert idx.loading == 1
    idx.apply(KVEventBatch(instance_id="a", seq=3, timestamp=0.0, events=()))  # lost 1 and 2
    idx.apply(KVEventBatch(instance_id="a", seq=5, timestamp=0.0, events=()))  # lost again: still one
    assert idx.loading == 2
    idx.remove_worker("b")
    assert idx.loading == 1
    idx.check_integrity()


def test_no_worker_login_may_take_a_replica_s_id() -> None:
    with pytest.raises(ValueError, match="router-"):
        worker_permissions(REPLICA_ID_PREFIX + "abc")
    assert worker_permissions("router2") is not None


async def _fleet(rt, n: int, blocks: int):  # type: ignore[no-untyped-def]
    engines = {}
    for i in range(n):
        engines[f"w{i}"] = e = FakeEngine(block_size=BLOCK, num_blocks=100_000)
        e.fill(chain(blocks), announce=False)
    workers = [make_worker(wid, e, rt)[0] for wid, e in engines.items()]
    await asyncio.gather(*(w.start() for w in workers))
    return engines, workers


def _converged(svc: RouterService, engines: dict[str, FakeEngine]) -> bool:
    """Every worker indexed as it is, and no pull running (its counts are in)."""
    return not svc.kv_sync.syncing and all(indexed(svc, wid) == stored(e) for wid, e in engines.items())


@contextlib.asynccontextmanager
async def _two_routers(rt, n: int, blocks: int, between):  # type: ignore[no-untyped-def]
    """``n`` workers, a first router converged on them, ``await between(rt, first, workers)``, then a
    second router, converged too: (engines, workers, first, second)."""
    engines, workers = await _fleet(rt, n, blocks)
    first = RouterService(discovery=rt.discovery, requests=rt.requests, events=rt.events)
    await first.start()
    second = None
    try:
        await settle(lambda: _converged(first, engines))
        await between(rt, first, workers)
        second = RouterService(discovery=rt.discovery, requests=rt.requests, events=rt.events)
        await second.start()
        await settle(lambda: _converged(second, engines))
        yield engines, workers, first, second
    finally:
        if second is not None:
            await second.close()
        await first.close()
        await asyncio.gather(*(w.drain(0.0) for w in workers))


@pytest.mark.timeout(60)
def test_a_second_replica_copies_the_index_and_asks_no_worker_for_a_snapshot() -> None:
    async def once_each(rt, first, workers) -> None:  # type: ignore[no-untyped-def]
        assert [w.kv_sync.snapshots for w in workers] == [1] * 6

    async def body(rt) -> None:  # type: ignore[no-untyped-def]
        async with _two_routers(rt, 6, 3000, once_each) as (engines, workers, first, second):
            stats = second.kv_sync.stats
            assert (stats.replicas, stats.snapshots, stats.replica_misses) == (6, 0, 0)
            assert stats.snapshot_blocks == 6 * 3000 and stats.replica_bytes / stats.snapshot_blocks < 10
            assert [w.kv_sync.snapshots for w in workers] == [1] * 6  # the workers sent nothing more
            assert first.kv_replica.served == 6
            engines["w0"].fill(chain(5))  # live events go on from the copied state's seq
            await settle(lambda: _converged(second, engines) and _converged(first, engines))
            assert (stats.snapshots, stats.replays) == (0, 0)
            text = second.prometheus_text()
            assert 'interlock_router_kv_syncs_total{kind="replica"} 6' in text
            assert f"interlock_router_kv_replica_bytes_total {stats.replica_bytes}" in text

    run_with_runtime(body)


@pytest.mark.timeout(60)
def test_a_replica_that_cannot_answer_leaves_the_state_to_the_worker() -> None:
    async def endpoint_gone(rt, first, workers) -> None:  # type: ignore[no-untyped-def]
        assert first._replica_address is not None
        await rt.requests.unserve(first._replica_address)  # registered, but the endpoint is gone

    async def body(rt) -> None:  # type: ignore[no-untyped-def]
        async with _two_routers(rt, 3, 500, endpoint_gone) as (_, workers, _first, second):
            stats = second.kv_sync.stats
            assert (stats.replicas, stats.snapshots, stats.replica_misses) == (0, 3, 3)
            assert [w.kv_sync.snapshots for w in workers] == [2] * 3

    run_with_runtime(body)


@pytest.mark.timeout(60)
def test_a_replica_without_the_worker_s_whole_state_answers_missing() -> None:
    async def w1_lost(rt, first, workers) -> None:  # type: ignore[no-untyped-def]
        router = first.routers["m"]
        seq = router.kv_seq("w1")
        assert seq is not None
        first.kv_sync.pull = lambda *a, **k: None  # the gap below is not pulled (yet)
        router.apply_events(KVEventBatch(instance_id="w1", seq=seq + 2, timestamp=0.0, events=()))
        assert router.kv_seq("w1") is None  # a batch was lost: no whole state of w1 here

    async def body(rt) -> None:  # type: ignore[no-untyped-def]
        async with _two_routers(rt, 2, 200, w1_lost) as (_, _workers, first, second):
            stats = second.kv_sync.stats
            assert (stats.replicas, stats.snapshots, stats.replica_misses) == (1, 1, 1)
            assert first.kv_replica.missing == 1

    run_with_runtime(body)
