"""A frontend without a KV index of its own (``kv_index="remote"``) asks one that has it, per
request (``router/kv_lookup.py``): it subscribes to no KV event, yet sends a request to the
worker holding its prefix; with no such replica, or none answering, it places by load."""

from __future__ import annotations

import asyncio

import pytest

from interlock.engine.serving import FakeEngine
from interlock.errors import ConfigError
from interlock.kvhash import hash_blocks
from interlock.router.admission import RequestMeta
from interlock.router.kv_lookup import RemoteChain
from interlock.router.service import RouterService, ServiceOptions
from tests.router.test_kv_sync import BLOCK, make_worker, run_with_runtime, settle

REMOTE = ServiceOptions(kv_index="remote")


def _prompt(worker: int) -> list[int]:
    return [1000 * worker + t for t in range(BLOCK * 8)]


async def _fleet(rt, n: int, engines: list[FakeEngine] | None = None):  # type: ignore[no-untyped-def]
    """``n`` workers, worker ``i`` holding the blocks of ``_prompt(i)`` (their engines appended
    to ``engines``)."""
    workers = []
    for i in range(n):
        engine = FakeEngine(block_size=BLOCK, num_blocks=10_000)
        engine.fill(hash_blocks(_prompt(i), BLOCK), announce=False)
        if engines is not None:
            engines.append(engine)
        workers.append(make_worker(f"w{i}", engine, rt)[0])
    await asyncio.gather(*(w.start() for w in workers))
    return workers


async def _route(svc: RouterService, i: int, worker: int):  # type: ignore[no-untyped-def]
    router = await svc.router_when_ready("m", 5.0)
    assert router is not None
    prompt = _prompt(worker) + [7, 7, 7]
    meta = RequestMeta(f"r{i}", len(prompt), max_tokens=4)
    d = await svc.dispatcher.route(router, meta, hash_blocks(prompt, BLOCK))
    svc.dispatcher.finish(router, d.request_id)
    return d


def test_remote_mode_needs_replicas() -> None:
    with pytest.raises(ConfigError, match="kv_index"):
        ServiceOptions(kv_index="elsewhere")
    with pytest.raises(ConfigError, match="replica"):
        ServiceOptions(kv_index="remote", replica=False)


@pytest.mark.timeout(60)
def test_a_frontend_without_an_index_routes_to_the_holder_by_a_replica_s_lookup() -> None:
    async def body(rt) -> None:  # type: ignore[no-untyped-def]
        workers = await _fleet(rt, 4)
        local = RouterService(discovery=rt.discovery, requests=rt.requests, events=rt.events)
        remote = RouterService(discovery=rt.discovery, requests=rt.requests, events=rt.events, options=REMOTE)
        await local.start()
        await remote.start()
        try:
            await settle(lambda: local.num_workers() == 4 and remote.num_workers() == 4)
            await settle(lambda: local.kv_sync.stats.snapshots == 4)
            for i in range(8):
                d = await _route(remote, i, worker=i % 4)
                assert d.worker_id == f"w{i % 4}" and d.overlap_blocks == 8, d.header()
            assert remote.kv_lookup.stats.answered == 8 and local.kv_lookup_server.answered == 8
            router = remote.routers["m"]
            assert all(router.indexer.mode(f"w{i}") == "approx" for i in range(4))  # no KV event heard
            assert remote.kv_sync.stats.snapshots == 0 and remote._replica_address is None
            assert 'interlock_router_kv_lookups_total{outcome="answered"} 8' in remote.prometheus_text()
            hashes = hash_blocks(_prompt(2), BLOCK)
            chain = await remote.looked_up(router, hashes)
            assert isinstance(chain, RemoteChain) and chain.holders == {"w2": (8, 0)}
            assert await remote.looked_up(router, chain) is chain  # looked up once per request
        finally:
            await remote.close()
            await local.close()
            await asyncio.gather(*(w.drain(0.0) for w in workers))

    run_with_runtime(body)


@pytest.mark.timeout(60)
def test_with_no_replica_to_ask_a_frontend_without_an_index_places_by_load() -> None:
    async def body(rt) -> None:  # type: ignore[no-untyped-def]
        workers = await _fleet(rt, 2)
        remote = RouterService(discovery=rt.discovery, requests=rt.requests, events=rt.events, options=REMOTE)
        await remote.start()
        try:
            await settle(lambda: remote.num_workers() == 2)
            d = await _route(remote, 0, worker=1)
            assert d.worker_id in ("w0", "w1") and d.overlap_blocks == 0
            assert remote.kv_lookup.stats.no_replica == 1
            remote.kv_lookup.addresses["router-gone"] = "inproc://nowhere"  # known, but not there
            await _route(remote, 1, worker=1)
            assert remote.kv_lookup.stats.failed == 1
        finally:
            await remote.close()
            await asyncio.gather(*(w.drain(0.0) for w in workers))

    run_with_runtime(body)


@pytest.mark.timeout(60)
def test_a_sharded_index_keeps_each_worker_once_and_every_router_finds_every_holder() -> None:
    from interlock.router.shards import shard_of

    async def body(rt) -> None:  # type: ignore[no-untyped-def]
        n = 8
        engines: list[FakeEngine] = []
        workers = await _fleet(rt, n, engines)
        owner = {f"w{i}": shard_of(f"w{i}", 2) for i in range(n)}
        assert set(owner.values()) == {0, 1}  # both shards hold some of these eight
        shards = [
            RouterService(
                discovery=rt.discovery,
                requests=rt.requests,
                events=rt.events,
                options=ServiceOptions(kv_shard=f"{i}/2"),
            )
            for i in range(2)
        ]
        remote = RouterService(discovery=rt.discovery, requests=rt.requests, events=rt.events, options=REMOTE)
        for svc in (*shards, remote):
            await svc.start()
        try:
            await settle(lambda: all(s.num_workers() == n for s in (*shards, remote)))
            for i, svc in enumerate(shards):  # each pulled its own workers' states only
                mine = sum(1 for s in owner.values() if s == i)
                await settle(lambda svc=svc, mine=mine: svc.kv_sync.stats.snapshots == mine)
                router = svc.routers["m"]
                for w, s in owner.items():
                    assert (router.indexer.mode(w) == "approx") == (s != i), (w, s, i)
            # A frontend without an index, and each shard itself, route every prompt to its
            # holder, whichever shard keeps it: the shards' answers are joined.
            for k, svc in enumerate((remote, *shards)):
                for i in range(n):
                    d = await _route(svc, 100 * k + i, worker=i)
                    assert d.worker_id == f"w{i}" and d.overlap_blocks == 8, (k, d.header())
            # Blocks stored later reach their shard as KV events (each shard follows only its
            # own workers' subjects): a new prefix is routed to its holder.
            for i in range(n):
                fresh = [50_000 + 100 * i + t for t in range(BLOCK * 4)]
                engines[i].fill(hash_blocks(fresh, BLOCK))

                async def holder_known(i: int = i, fresh: list[int] = fresh) -> bool:
                    router = await remote.router_when_ready("m", 5.0)
                    assert router is not None
                    chain = await remote.looked_up(router, hash_blocks(fresh + [7], BLOCK))
                    return isinstance(chain, RemoteChain) and chain.holders.get(f"w{i}", (0, 0))[0] == 4

                for _ in range(100):
                    if await holder_known():
                        break
                    await asyncio.sleep(0.02)
                else:
                    raise AssertionError(f"shard {owner[f'w{i}']} never heard w{i}'s new blocks")
            answered = [s.kv_lookup_server.answered for s in shards]
            assert answered[0] == answered[1] >= 3 * n  # every lookup asked both shards (its own: no count)
            await shards[1].close()  # a shard gone: its workers' prefixes are unknown, the rest count
            await settle(lambda: len(remote.kv_lookup.addresses) == 1)
            for i in range(n):
                d = await _route(remote, 1000 + i, worker=i)
                assert (d.overlap_blocks == 8) == (owner[f"w{i}"] == 0), d.header()
        finally:
            for svc in (remote, *shards):
                await svc.close()
            await asyncio.gather(*(w.drain(0.0) for w in workers))

    run_with_runtime(body)


def test_shards_split_workers_evenly_and_stably() -> None:
    from interlock.router.shards import Shard, parse_shard, shard_of

    ids = [f"w{i}-abcd" for i in range(4000)]
    counts = [0] * 4
    for w in ids:
        counts[shard_of(w, 4)] += 1
    assert all(900 < c < 1100 for c in counts), counts
    moved = sum(shard_of(w, 4) != shard_of(w, 5) for w in ids)
    assert 600 < moved < 1000  # a fifth shard takes about a fifth of the workers, from all four
    assert all(Shard(shard_of(w, 3), 3).owns(w) for w in ids[:50])
    assert parse_shard("") == (0, 1) and parse_shard("2/3") == (2, 3)
    for bad in ("3/3", "-1/2", "1", "a/b", "1/0"):
        with pytest.raises(ConfigError, match="kv_shard"):
            parse_shard(bad)
    with pytest.raises(ConfigError, match="kv_shard"):
        ServiceOptions(kv_index="remote", kv_shard="0/2")
