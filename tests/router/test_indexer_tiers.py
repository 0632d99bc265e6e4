"""The router's index of KV held below the workers' device pools (host, disk) and its price."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from interlock.protocol import TierStats
from interlock.protocol.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from interlock.router.cost import CostParams, ttft_costs
from interlock.router.indexer import KvIndexer
from interlock.router.load import LoadTracker
from tests.factories import load_report


def stored(*hashes: int, tier: str = "device") -> BlockStored:
    return BlockStored(block_hashes=tuple(hashes), parent_block_hash=None, tier=tier)


def removed(*hashes: int, tier: str = "device") -> BlockRemoved:
    return BlockRemoved(block_hashes=tuple(hashes), tier=tier)


class Feed:
    def __init__(self, *workers: str) -> None:
        self.ix = KvIndexer()
        self.seq: dict[str, int] = {}
        for w in workers:
            self.ix.add_worker(w)
            self.ix.apply(KVEventBatch(instance_id=w, seq=0, timestamp=0.0, events=(), snapshot=True))
            self.seq[w] = 0

    def __call__(self, w: str, *events: object) -> None:
        self.seq[w] += 1
        self.ix.apply(KVEventBatch(instance_id=w, seq=self.seq[w], timestamp=0.0, events=tuple(events)))  # type: ignore[arg-type]

    def lower(self, hashes: list[int]) -> dict[str, int]:
        ov = self.ix.lower_overlaps(hashes)
        return {w: int(ov[self.ix.slot_of(w)]) for w in self.seq if ov[self.ix.slot_of(w)]}


def test_lower_tier_blocks_count_after_the_device_prefix() -> None:
    f = Feed("a", "b", "c")
    f("a", stored(1, 2), stored(3, 4, tier="host"), stored(5, tier="disk"))
    f("b", stored(1, 2, 3, tier="host"))
    f("c", stored(1), stored(3, tier="host"))  # a gap at 2: nothing to load
    assert f.ix.overlap_by_worker([1, 2, 3, 4, 5]) == {"a": 2, "c": 1}
    assert f.lower([1, 2, 3, 4, 5]) == {"a": 3, "b": 3}
    f("a", removed(4, tier="host"))
    assert f.lower([1, 2, 3, 4, 5]) == {"a": 1, "b": 3}
    f("b", stored(1, 2, 3, tier="disk"), removed(1, 2, 3, tier="host"))  # moved down: still there
    assert f.lower([1, 2, 3]) == {"a": 1, "b": 3}
    f("b", AllBlocksCleared())
    assert f.lower([1, 2, 3]) == {"a": 1}
    f.ix.check_integrity()


def test_a_worker_that_leaves_takes_its_lower_tiers_with_it() -> None:
    f = Feed("a")
    f("a", stored(1, 2, tier="host"))
    f.ix.remove_worker("a")
    assert not f.ix.has_lower_tiers()
    f.ix.check_integrity()


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from("ab"),
            st.booleans(),
            st.sampled_from(["device", "host", "disk"]),
            st.lists(st.integers(0, 5), min_size=1, max_size=3),
        ),
        max_size=30,
    ),
    st.lists(st.integers(0, 5), min_size=1, max_size=6),
)
def test_lower_overlap_matches_a_per_worker_walk(ops: list, query: list[int]) -> None:
    f = Feed("a", "b")
    held: dict[str, dict[str, set[int]]] = {w: {"device": set(), "host": set(), "disk": set()} for w in "ab"}
    for w, store, tier, hashes in ops:
        f(w, stored(*hashes, tier=tier) if store else removed(*hashes, tier=tier))
        (held[w][tier].update if store else held[w][tier].difference_update)(hashes)
    f.ix.check_integrity()
    for w in "ab":
        dev = 0
        while dev < len(query) and query[dev] in held[w]["device"]:
            dev += 1
        low = 0
        below = held[w]["host"] | held[w]["disk"]
        while dev + low < len(query) and query[dev + low] in below:
            low += 1
        assert int(f.ix.lower_overlaps(query)[f.ix.slot_of(w)]) == low


def test_a_lower_tier_hit_costs_its_load_time_not_its_prefill() -> None:
    p = CostParams(block_size=100, chunk_tokens=10_000, miss_weight=0.0, decode_weight=0.0)
    n = 3
    base = dict(
        prompt_tokens=1000,
        overlap_blocks=np.zeros(n),
        queued_prefill=np.zeros(n),
        per_token_s=np.full(n, 1e-4),
        step_overhead_s=np.zeros(n),
        decode_step_s=np.zeros(n),
        kv_usage=np.zeros(n),
    )
    c = ttft_costs(
        p,
        **base,
        lower_blocks=np.array([0, 5, 5]),  # type: ignore[arg-type]
        load_s_per_block=np.array([1e-3, 1e-3, 1e-2]),
    )
    # worker 0 computes 1000 tokens; 1 and 2 compute 500 and load 5 blocks at 1 / 10 ms each
    assert np.allclose(c, [0.1, 0.05 + 0.005, 0.05 + 0.05])


def test_the_load_tracker_keeps_the_measured_load_time_per_block() -> None:
    lt = LoadTracker()
    lt.add_worker(0, kv_blocks_total=10)
    report = load_report(
        "w",
        timestamp=1.0,
        kv_blocks_total=10,
        kv_tiers=(
            TierStats(tier="host", blocks=1, capacity=4, loads=3, load_s=0.003),
            TierStats(tier="disk", blocks=1, capacity=4, loads=1, load_s=0.005),
        ),
    )
    lt.apply_report(0, report, 1.0)
    assert lt.load_s_per_block[0] == 0.002


def test_the_router_sends_a_prefix_to_the_worker_that_holds_it_below_its_pool() -> None:
    from tests.router.test_model_router import PROMPT, make, route

    # a miss charged once more (computing 400 tokens at the default 10,000 tokens/s: 0.08 s)
    r, _ = make(3, cost=CostParams(miss_weight=1.0))
    hashes = tuple(r.block_hashes(PROMPT))
    r.apply_events(
        KVEventBatch(
            instance_id="w1",
            seq=0,
            timestamp=0.0,
            events=(
                BlockStored(block_hashes=hashes[:10], parent_block_hash=None, tier="host"),
                BlockStored(block_hashes=hashes[10:], parent_block_hash=None, tier="disk"),
            ),
        )
    )
    # Unmeasured, 100 blocks of 4 tokens at the pessimistic 1 ms each lose to computing them.
    assert route(r, "a", PROMPT).worker_id != "w1"
    r.apply_load(
        load_report(
            "w1",
            timestamp=1.0,
            kv_blocks_total=100_000,
            kv_tiers=(TierStats(tier="host", blocks=10, capacity=10, loads=10, load_s=1e-4),),
        )
    )
    assert route(r, "b", PROMPT).worker_id == "w1"  # measured at 10 us a block: load it


def test_the_service_exports_per_tier_metrics() -> None:
    import asyncio

    import msgspec

    from interlock.protocol import subjects
    from tests.router.test_service import _run, _settle, info

    async def body(runtime, svc) -> None:  # type: ignore[no-untyped-def]
        await runtime.discovery.register(info("w"))
        await _settle(svc, lambda: svc.instance("w") is not None)
        report = load_report(
            "w",
            kv_tiers=(
                TierStats(tier="host", blocks=3, capacity=8, hits=5, loads=4, load_s=0.25, evictions=2),
            ),
        )
        await runtime.events.publish(subjects.load("w"), msgspec.msgpack.encode(report))
        await _settle(svc, lambda: svc.report("w") is not None)
        text = svc.prometheus_text()
        assert 'interlock_worker_kv_tier_blocks{worker="w",model="m",tier="host"} 3' in text
        assert 'interlock_worker_kv_tier_loads_total{worker="w",model="m",tier="host"} 4' in text
        assert 'interlock_worker_kv_tier_load_seconds_total{worker="w",model="m",tier="host"} 0.25' in text
        assert 'interlock_worker_kv_tier_evictions_total{worker="w",model="m",tier="host"} 2' in text
        await asyncio.sleep(0)

    _run(body)
