"""Pending prefixes: a routed request's blocks count as held on its worker until that worker's
KV events say so (``KvIndexer.record_pending``), in the compiled map and the dict alike."""

from __future__ import annotations

import pytest

from interlock.protocol.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from interlock.router import Router, RouterConfig
from interlock.router.indexer import KvIndexer
from interlock.router.native import load
from tests.router.test_model_router import BS, Clock, info, route

COMPILED = [True, False] if load() is not None else [False]


def stored(*hashes: int) -> BlockStored:
    return BlockStored(block_hashes=tuple(hashes), parent_block_hash=None)


def batch(wid: str, seq: int, *events, snapshot: bool = False) -> KVEventBatch:
    return KVEventBatch(instance_id=wid, seq=seq, timestamp=0.0, events=tuple(events), snapshot=snapshot)


def events_worker(ix: KvIndexer, wid: str, *held: int) -> None:
    ix.add_worker(wid)
    ix.apply(batch(wid, 0, AllBlocksCleared(), stored(*held), snapshot=True))


@pytest.mark.parametrize("compiled", COMPILED)
def test_a_routed_prefix_counts_as_held_until_the_workers_events_say_so(compiled: bool) -> None:
    ix = KvIndexer(pending_ttl_s=10.0, compiled=compiled)
    events_worker(ix, "a", 1, 2)
    events_worker(ix, "b")
    ix.record_pending("a", [1, 2, 3, 4, 5], now=0.0)
    assert ix.overlap_by_worker([1, 2, 3, 4, 5, 6]) == {"a": 5}  # the next request sees it now
    ix.apply(batch("a", 1, stored(3, 4)))  # the worker computed two of them
    ix.check_integrity()
    ix.expire_pending(9.9)
    assert ix.overlap_by_worker([1, 2, 3, 4, 5]) == {"a": 5}
    ix.expire_pending(10.0)  # 5 never came: the guess goes, what the worker said stays
    assert ix.overlap_by_worker([1, 2, 3, 4, 5]) == {"a": 4}
    assert not ix.pending_waiting
    ix.check_integrity()


@pytest.mark.parametrize("compiled", COMPILED)
def test_blocks_the_worker_holds_already_are_never_taken_for_pending(compiled: bool) -> None:
    # 7 is held past a block the worker lacks (its parent 6 evicted first): routing a request
    # over it must not make it a guess that expires and takes the worker's own block away
    ix = KvIndexer(pending_ttl_s=1.0, compiled=compiled)
    events_worker(ix, "a", 1, 7)
    ix.record_pending("a", [1, 6, 7], now=0.0)
    assert ix.overlap_by_worker([1, 6, 7]) == {"a": 3}
    ix.expire_pending(5.0)
    assert ix.overlap_by_worker([1, 6, 7]) == {"a": 1} and ix.blocks_of("a") == {1, 7}
    ix.check_integrity()


@pytest.mark.parametrize("compiled", COMPILED)
def test_a_removal_event_or_a_clear_ends_a_guess(compiled: bool) -> None:
    ix = KvIndexer(pending_ttl_s=10.0, compiled=compiled)
    events_worker(ix, "a")
    ix.record_pending("a", [1, 2, 3], now=0.0)
    ix.apply(batch("a", 1, stored(1, 2, 3), BlockRemoved(block_hashes=(3,))))
    ix.expire_pending(20.0)
    assert ix.blocks_of("a") == {1, 2}
    ix.record_pending("a", [1, 2, 4], now=20.0)
    ix.apply(batch("a", 2, AllBlocksCleared()))
    assert ix.blocks_of("a") == set()
    ix.expire_pending(40.0)
    ix.check_integrity()


@pytest.mark.parametrize("compiled", COMPILED)
def test_a_replicas_copy_leaves_the_guesses_out(compiled: bool) -> None:
    ix = KvIndexer(pending_ttl_s=10.0, compiled=compiled)
    events_worker(ix, "a", 1)
    ix.record_pending("a", [1, 2], now=0.0)
    seq, tiers = ix.export("a")
    assert seq == 0 and tiers == {"device": [1]}


@pytest.mark.parametrize("compiled", COMPILED)
def test_no_guess_for_a_loading_or_approximate_worker_or_with_the_ttl_at_zero(compiled: bool) -> None:
    ix = KvIndexer(pending_ttl_s=10.0, compiled=compiled)
    ix.add_worker("loading")  # waits for its state: a snapshot would drop the guess
    ix.add_worker("quiet", publishes_events=False)  # predicted by record_routed instead
    ix.record_pending("loading", [1], now=0.0)
    ix.record_pending("quiet", [1], now=0.0)
    off = KvIndexer(pending_ttl_s=0.0, compiled=compiled)
    events_worker(off, "a")
    off.record_pending("a", [1], now=0.0)
    assert ix.overlap_by_worker([1]) == {} and off.overlap_by_worker([1]) == {}
    assert not ix.pending_waiting and not off.pending_waiting
    ix.check_integrity()


def test_a_follow_up_decided_before_the_events_goes_where_its_prefix_is_being_computed() -> None:
    prompt = list(range(400))

    def choices(ttl: float) -> tuple[str, str]:
        clock = Clock()
        r = Router(RouterConfig(block_size=BS, seed=0, pending_ttl_s=ttl), clock=clock)
        for i in range(4):
            r.add_worker(info(f"w{i}"))
        for wid in r.needs_resync():
            r.apply_events(KVEventBatch(instance_id=wid, seq=-1, timestamp=0.0, events=(), snapshot=True))
        first = route(r, "r1", prompt)
        r.on_finish("r1")  # answered; the worker's events not heard yet
        clock.t = 0.5
        return first.worker_id, route(r, "r2", [*prompt, 7, 7, 7, 7]).worker_id

    first, follow = choices(30.0)
    assert follow == first
    first, follow = choices(0.0)  # without: nobody holds the prefix yet, the choice is by load
    assert follow != first
