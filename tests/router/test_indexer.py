from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from interlock.errors import TransportError
from interlock.protocol.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from interlock.router.indexer import ApplyResult, KvIndexer, dropouts, fill_by_depth, overlap_of


def stored(*hashes: int) -> BlockStored:
    return BlockStored(block_hashes=tuple(hashes), parent_block_hash=None)


def batch(wid: str, seq: int, *events, snapshot: bool = False) -> KVEventBatch:
    return KVEventBatch(instance_id=wid, seq=seq, timestamp=0.0, events=tuple(events), snapshot=snapshot)


def snapshot(wid: str, seq: int, hashes: set[int]) -> KVEventBatch:
    return batch(wid, seq, AllBlocksCleared(), stored(*sorted(hashes)), snapshot=True)


def test_overlap_is_longest_cached_prefix_per_worker() -> None:
    ix = KvIndexer()
    ix.add_worker("a")
    ix.add_worker("b")
    ix.apply(batch("a", 0, stored(1, 2, 3)))
    ix.apply(batch("b", 0, stored(1, 2), stored(4)))
    assert ix.overlap_by_worker([1, 2, 3, 4]) == {"a": 3, "b": 2}
    assert ix.overlap_by_worker([2, 3]) == {"a": 2, "b": 1}
    assert ix.overlap_by_worker([9, 1]) == {}
    ix.check_integrity()


def test_removed_and_cleared_blocks_leave_the_index() -> None:
    ix = KvIndexer()
    ix.add_worker("a")
    ix.apply(batch("a", 0, stored(1, 2, 3)))
    ix.apply(batch("a", 1, BlockRemoved(block_hashes=(2,))))
    assert ix.overlap_by_worker([1, 2, 3]) == {"a": 1}
    ix.apply(batch("a", 2, AllBlocksCleared()))
    assert ix.num_blocks("a") == 0
    ix.check_integrity()


def test_removing_a_worker_drops_its_blocks_and_frees_its_slot() -> None:
    ix = KvIndexer()
    ix.add_worker("a")
    ix.add_worker("b")
    ix.apply(batch("a", 0, stored(1, 2)))
    ix.apply(batch("b", 0, stored(1)))
    slot_a = ix.slot_of("a")
    ix.remove_worker("a")
    assert ix.overlap_by_worker([1, 2]) == {"b": 1}
    assert ix.add_worker("c") == slot_a
    assert ix.overlap_by_worker([1, 2]) == {"b": 1}
    ix.check_integrity()


def test_duplicates_ignored_gap_flags_resync_snapshot_clears_it() -> None:
    ix = KvIndexer()
    ix.add_worker("a")
    assert ix.needs_resync() == ["a"]  # joining: ask for a snapshot
    assert ix.apply(snapshot("a", -1, set())) is ApplyResult.APPLIED
    assert ix.needs_resync() == []
    assert ix.apply(batch("a", 0, stored(1))) is ApplyResult.APPLIED
    assert ix.apply(batch("a", 0, stored(1))) is ApplyResult.DUPLICATE
    assert ix.apply(batch("a", 2, stored(3))) is ApplyResult.GAP
    assert ix.needs_resync() == ["a"]
    ix.apply(snapshot("a", 2, {1, 2, 3}))
    assert ix.needs_resync() == []
    assert ix.overlap_by_worker([1, 2, 3]) == {"a": 3}
    assert ix.apply(batch("a", 9)) is ApplyResult.GAP
    assert ix.apply(batch("zzz", 0)) is ApplyResult.UNKNOWN_WORKER


def test_approx_mode_predicts_from_routing_with_ttl_then_switches_to_events() -> None:
    ix = KvIndexer(approx_ttl_s=10.0)
    ix.add_worker("quiet", publishes_events=False)
    assert ix.mode("quiet") == "approx" and ix.needs_resync() == []
    ix.record_routed("quiet", [1, 2, 3], now=0.0)
    assert ix.overlap_by_worker([1, 2, 3, 4]) == {"quiet": 3}
    ix.record_routed("quiet", [1, 2], now=5.0)  # refreshes 1 and 2 only
    ix.expire(11.0)
    assert ix.overlap_by_worker([1, 2, 3]) == {"quiet": 2}
    ix.expire(16.0)
    assert ix.overlap_by_worker([1, 2, 3]) == {}
    ix.record_routed("quiet", [7], now=20.0)
    ix.apply(batch("quiet", 0, stored(5)))  # it publishes after all
    assert ix.mode("quiet") == "events"
    assert ix.overlap_by_worker([7]) == {} and ix.overlap_by_worker([5]) == {"quiet": 1}
    ix.record_routed("quiet", [8], now=21.0)  # ignored once events flow
    assert ix.overlap_by_worker([8]) == {}
    ix.check_integrity()


def test_overlap_vector_handles_many_workers() -> None:
    ix = KvIndexer()
    for i in range(300):
        ix.add_worker(f"w{i}")
        ix.apply(batch(f"w{i}", 0, stored(*range(i % 7 + 1))))
    ov = ix.overlaps(list(range(10)))
    assert [int(ov[ix.slot_of(f"w{i}")]) for i in range(300)] == [i % 7 + 1 for i in range(300)]


# ---- property: the index tracks a worker's true cache through drops and duplicates ----
ops = st.lists(
    st.one_of(
        st.tuples(st.just("store"), st.lists(st.integers(0, 40), min_size=1, max_size=5)),
        st.tuples(st.just("remove"), st.lists(st.integers(0, 40), min_size=1, max_size=5)),
        st.tuples(st.just("clear"), st.just([])),
    ),
    min_size=1,
    max_size=40,
)
fates = st.lists(st.sampled_from(["deliver", "deliver", "deliver", "drop", "dup"]), min_size=40, max_size=40)


@settings(max_examples=150, deadline=None)
@given(ops_a=ops, ops_b=ops, fates=fates)
def test_index_matches_truth_after_resync_whatever_is_lost(ops_a, ops_b, fates) -> None:
    ix = KvIndexer()
    truth: dict[str, set[int]] = {"a": set(), "b": set()}
    seqs = {"a": 0, "b": 0}
    lost = {"a": False, "b": False}
    for wid in truth:
        ix.add_worker(wid)
        ix.apply(snapshot(wid, -1, set()))
    for i, (wid, (kind, hashes)) in enumerate([("a", o) for o in ops_a] + [("b", o) for o in ops_b]):
        if kind == "store":
            truth[wid] |= set(hashes)
            ev = stored(*hashes)
        elif kind == "remove":
            truth[wid] -= set(hashes)
            ev = BlockRemoved(block_hashes=tuple(hashes))
        else:
            truth[wid].clear()
            ev = AllBlocksCleared()
        b = batch(wid, seqs[wid], ev)
        seqs[wid] += 1
        fate = fates[i % len(fates)]
        if fate == "drop":
            lost[wid] = True
            continue
        result = ix.apply(b)
        if fate == "dup":
            assert ix.apply(b) is ApplyResult.DUPLICATE
        if lost[wid]:
            assert wid in ix.needs_resync()  # the gap was noticed on the next delivered batch
        else:
            assert result is ApplyResult.APPLIED
            assert ix.blocks_of(wid) == truth[wid]
        ix.check_integrity()
    for wid in truth:
        if wid in ix.needs_resync() or lost[wid]:
            ix.apply(snapshot(wid, seqs[wid] - 1, truth[wid]))
        assert ix.blocks_of(wid) == truth[wid]
        assert wid not in ix.needs_resync()
    ix.check_integrity()


def test_a_snapshot_with_a_seq_of_its_own_then_live_batches_from_the_next() -> None:
    ix = KvIndexer()
    ix.add_worker("a")
    ix.apply(batch("a", 0, stored(1)))
    assert ix.apply(batch("a", 2, stored(2))) is ApplyResult.GAP
    ix.apply(snapshot("a", 3, {1, 2, 7}))  # the engine worker's snapshot takes seq 3
    assert ix.apply(batch("a", 4, BlockRemoved(block_hashes=(7,)))) is ApplyResult.APPLIED
    assert ix.blocks_of("a") == {1, 2} and ix.needs_resync() == []


def naive_overlap(blocks: set[int], hashes: list[int]) -> int:
    n = 0
    for h in hashes:
        if h not in blocks:
            break
        n += 1
    return n


chain_ops = st.lists(
    st.tuples(
        st.integers(0, 69),  # worker (past 64: bits beyond one machine word)
        st.booleans(),  # store or remove
        st.integers(0, 11),  # start of a run in the universal chain
        st.integers(1, 12),  # its length
    ),
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(chain_ops, st.lists(st.integers(0, 30), min_size=1, max_size=24))
def test_overlaps_equal_each_workers_longest_prefix_after_runs_stored_and_removed(ops, query) -> None:
    # Runs of one chain stored and removed by many workers: blocks stored together share a mask
    # object, so the lookup's shortcut for a block with the previous block's mask is exercised
    # by removals in the middle of runs and by runs stored over partly held ones.
    ix = KvIndexer()
    ids = [f"w{i}" for i in range(70)]
    for wid in ids:
        ix.add_worker(wid)
    truth: dict[str, set[int]] = {wid: set() for wid in ids}
    seqs = dict.fromkeys(ids, -1)
    chain = list(range(100, 124))
    for w, store, start, length in ops:
        wid = ids[w]
        run = tuple(chain[start : start + length])
        seqs[wid] += 1
        ev = stored(*run) if store else BlockRemoved(block_hashes=run)
        ix.apply(batch(wid, seqs[wid], ev))
        truth[wid] = truth[wid] | set(run) if store else truth[wid] - set(run)
    ix.check_integrity()
    for hashes in (chain, chain[:5] + [7] + chain[5:], [chain[0] + q for q in query]):
        got = ix.overlaps(hashes)
        for wid in ids:
            assert got[ix.slot_of(wid)] == naive_overlap(truth[wid], hashes), wid
        runs = ix.overlap_masks(hashes)
        for wid in ids:
            assert overlap_of(runs, ix.slot_of(wid)) == naive_overlap(truth[wid], hashes)


@pytest.mark.parametrize("dtype", [np.float64, np.int32])
def test_fill_by_depth_for_few_and_many_workers(dtype) -> None:
    few = (1 << 3) | (1 << 199)
    many = sum(1 << i for i in range(0, 200, 3))
    fewer = sum(1 << i for i in range(0, 200, 6))
    for runs in ([(few, 2)], [(few, 2), (1 << 3, 1)], [(many, 5)], [(many, 5), (fewer, 1), (1 << 6, 4)]):
        out = np.full(200, -1, dtype=dtype)
        table = [9, 7, 5, 2][: len(runs) + 1]
        fill_by_depth(out, runs, table)
        want = np.array([table[sum(m >> i & 1 for m, _ in runs)] for i in range(200)], dtype=dtype)
        assert out.dtype == dtype and np.array_equal(out, want)


def test_dropouts_say_where_each_worker_stops() -> None:
    runs = [(0b111, 2), (0b101, 3), (0b100, 1)]
    assert dropouts(runs) == [(0b010, 2), (0b001, 5), (0b100, 6)]
    assert [overlap_of(runs, s) for s in range(4)] == [5, 2, 6, 0]


@pytest.mark.parametrize("compiled", [True, False])
def test_the_index_holds_no_container_the_garbage_collector_must_walk(compiled: bool) -> None:
    """A full collection walks every tracked container's items: per-worker block sets would cost
    every request in flight a stall that grows with the fleet's blocks (0.43 s at 9 M)."""
    import gc

    ix = KvIndexer(compiled=compiled)
    ix.add_worker("a")
    events = (
        AllBlocksCleared(),
        BlockStored(block_hashes=tuple(range(1, 1000)), parent_block_hash=None),
        BlockStored(block_hashes=(5, 6), parent_block_hash=None, tier="host"),
    )
    ix.apply(KVEventBatch(instance_id="a", seq=0, timestamp=0.0, events=events, snapshot=True))
    ix.apply(KVEventBatch(instance_id="a", seq=1, timestamp=0.0, events=(BlockRemoved(block_hashes=(3, 4)),)))
    w = ix._workers["a"]
    assert ix.num_blocks("a") == 997 and 3 not in ix.blocks_of("a")
    assert len(w.blocks) == (0 if compiled else 997)  # the compiled map keeps the slot's blocks itself
    assert not gc.is_tracked(w.blocks) and not gc.is_tracked(w.lower)
    assert not gc.is_tracked(ix._holders) and not gc.is_tracked(ix._lower_holders)


@pytest.mark.parametrize("compiled", [True, False])
def test_a_state_loaded_in_slices_ends_as_its_snapshot_and_is_loading_until_then(compiled: bool) -> None:
    """``load_state``: a worker's pulled state a slice per step; flagged loading (no seq) until
    the last, then the same index as applying its snapshot batch at once."""
    tiers = {"device": list(range(1, 40)), "host": list(range(100, 110))}
    whole, sliced = KvIndexer(compiled=compiled), KvIndexer(compiled=compiled)
    for ix in (whole, sliced):
        for wid in ("a", "b"):
            ix.add_worker(wid)
        ix.apply(snapshot("a", 0, {900, 901}))  # an older state, replaced
        ix.apply(snapshot("b", 0, {1, 2, 3}))
    whole.apply(
        batch(
            "a",
            7,
            AllBlocksCleared(),
            stored(*tiers["device"]),
            BlockStored(block_hashes=tuple(tiers["host"]), parent_block_hash=None, tier="host"),
            snapshot=True,
        )
    )
    steps = sliced.load_state("a", 7, tiers, step=8)
    next(steps)  # cleared, loading
    assert sliced.needs_resync() == ["a"] and sliced.loading == 1 and sliced.kv_seq("a") is None
    assert sliced.num_blocks("a") == 0
    seen = []
    for _ in steps:
        seen.append(sliced.num_blocks("a"))
        assert sliced.needs_resync() == ["a"]
    assert seen == [8, 16, 24, 32, 39, 39]  # the device tier in 5 slices, then the host tier in 2
    assert sliced.needs_resync() == [] and sliced.loading == 0 and sliced.kv_seq("a") == 7
    sliced.check_integrity()
    query = list(range(1, 40))
    assert sliced.overlap_by_worker(query) == whole.overlap_by_worker(query) == {"a": 39, "b": 3}
    np.testing.assert_array_equal(
        sliced.lower_overlaps(list(range(100, 110))), whole.lower_overlaps(list(range(100, 110)))
    )
    assert sliced.export("a") == whole.export("a")
    sliced.apply(batch("a", 8, stored(50)))  # live batches go on from its seq
    assert sliced.kv_seq("a") == 8


def test_a_worker_that_leaves_while_its_state_loads_ends_the_load() -> None:
    ix = KvIndexer()
    ix.add_worker("a")
    steps = ix.load_state("a", 3, {"device": list(range(1, 100))}, step=10)
    next(steps)
    next(steps)
    ix.remove_worker("a")
    assert list(steps) == []
    assert ix.loading == 0 and ix.num_blocks() == 0
    ix.check_integrity()


def test_a_state_with_a_hash_outside_64_bits_changes_nothing() -> None:
    ix = KvIndexer()
    if not ix.compiled:
        pytest.skip("the dict takes any int")
    ix.add_worker("a")
    ix.apply(snapshot("a", 0, {5, 6}))
    with pytest.raises(TransportError, match="block hash -1 is not a 64-bit"):
        next(ix.load_state("a", 1, {"device": [1, 2, -1]}))
    assert ix.num_blocks("a") == 2 and ix.kv_seq("a") == 0 and ix.loading == 0


def test_a_pulled_state_as_an_array_indexes_as_the_same_list() -> None:
    from array import array

    hashes = [3, 2**63, 2**64 - 1, *range(10, 5_000)]
    as_list, as_array = KvIndexer(), KvIndexer()
    for ix, state in ((as_list, hashes), (as_array, array("Q", hashes))):
        ix.add_worker("a")
        for _ in ix.load_state("a", 4, {"device": state}):
            pass
        assert ix.kv_seq("a") == 4 and ix.loading == 0
        ix.check_integrity()
    assert as_list.blocks_of("a") == as_array.blocks_of("a") == frozenset(hashes)
    assert as_array.overlap_by_worker(hashes[:6]) == {"a": 6}
