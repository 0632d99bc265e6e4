"""The compiled prefix index (``router.native``, ``csrc/kvindex.c``) against the Python dict it
replaces: after the same events in any order, the same runs, overlaps, lower-tier overlaps and
unique counts; the whole compiled decision equal to the numpy one; hashes outside 64 bits
refused by name; the dict where the module cannot be built."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from interlock.errors import TransportError
from interlock.protocol.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from interlock.router import indexer, native
from interlock.router.cost import CostParams, cheapest, choose, ttft_costs
from interlock.router.indexer import KvIndexer
from interlock.router.route_kernel import MAX_RANKED, RouteKernel
from tests.router.test_route_kernel import left_slots, numpy_decision

MODULE = native.load()
pytestmark = pytest.mark.skipif(MODULE is None, reason="no C compiler: the compiled index is not built here")

WORKERS = 70  # past one 64-bit word of slots
BIG = st.integers(0, 2**64 - 1)
# A few chains, so that prefixes overlap; and big hashes, so the full 64-bit range is used.
CHAINS = [[1000 * c + i for i in range(30)] for c in range(3)] + [[2**64 - 1 - i for i in range(30)]]


def stored(hashes: tuple[int, ...], tier: str = "device") -> BlockStored:
    return BlockStored(block_hashes=hashes, parent_block_hash=None, tier=tier)


@st.composite
def events(draw: st.DrawFn) -> list[tuple[int, object]]:
    out: list[tuple[int, object]] = []
    for _ in range(draw(st.integers(0, 40))):
        w = draw(st.integers(0, WORKERS - 1))
        chain = draw(st.sampled_from(CHAINS))
        start = draw(st.integers(0, 29))
        run = tuple(chain[start : start + draw(st.integers(0, 30))])
        kind = draw(st.sampled_from(["store", "store", "remove", "host", "drop_host", "clear"]))
        if kind == "store":
            ev: object = stored(run)
        elif kind == "remove":
            ev = BlockRemoved(block_hashes=run)
        elif kind == "host":
            ev = stored(run, tier="host")
        elif kind == "drop_host":
            ev = BlockRemoved(block_hashes=run, tier="host")
        else:
            ev = AllBlocksCleared()
        out.append((w, ev))
    return out


def both() -> tuple[KvIndexer, KvIndexer]:
    compiled, plain = KvIndexer(), KvIndexer(compiled=False)
    assert compiled.compiled and not plain.compiled
    for ix in (compiled, plain):
        for w in range(WORKERS):
            ix.add_worker(f"w{w}")
    return compiled, plain


def apply_all(ix: KvIndexer, evs: list[tuple[int, object]]) -> None:
    for seq, (w, ev) in enumerate(evs):
        ix.apply(KVEventBatch(instance_id=f"w{w}", seq=seq, timestamp=0.0, events=(ev,)))  # type: ignore[arg-type]


@settings(max_examples=150, deadline=None)
@given(events(), st.sampled_from(CHAINS), st.integers(0, 29), st.lists(BIG, max_size=3))
def test_the_compiled_map_answers_as_the_dict_after_any_events(evs, chain, cut, noise) -> None:
    compiled, plain = both()
    apply_all(compiled, evs)
    apply_all(plain, evs)
    compiled.check_integrity()
    plain.check_integrity()
    for query in (chain, chain[:cut] + noise + chain[cut:], noise, [], chain[cut:]):
        assert compiled.overlap_masks(query) == plain.overlap_masks(query)
        np.testing.assert_array_equal(compiled.overlaps(query), plain.overlaps(query))
        np.testing.assert_array_equal(compiled.lower_overlaps(query), plain.lower_overlaps(query))
    assert compiled.unique_counts() == plain.unique_counts()
    assert compiled.num_blocks() == plain.num_blocks()


def test_removing_every_worker_empties_the_compiled_map() -> None:
    compiled, _ = both()
    apply_all(compiled, [(w, stored(tuple(CHAINS[w % 4]))) for w in range(WORKERS)])
    for w in range(WORKERS):
        compiled.remove_worker(f"w{w}")
    compiled.check_integrity()
    entries, masks, _ = MODULE.size(compiled._cmap)  # type: ignore[union-attr]
    assert (entries, masks) == (0, 0)


def test_a_hash_outside_64_bits_is_refused_by_name_and_nothing_of_the_batch_applied() -> None:
    compiled, _ = both()
    batch = KVEventBatch(
        instance_id="w0",
        seq=0,
        timestamp=0.0,
        events=(stored((1, 2)), stored((3, -5))),
    )
    with pytest.raises(TransportError, match="block hash -5 is not a 64-bit unsigned int"):
        compiled.apply(batch)
    assert compiled.num_blocks() == 0 and compiled.needs_resync() == [f"w{w}" for w in range(WORKERS)]
    # a lookup stops at such a hash: no worker can hold it
    compiled.apply(KVEventBatch(instance_id="w0", seq=0, timestamp=0.0, events=(stored((1, 2)),)))
    assert compiled.overlap_by_worker([1, -1, 2]) == {"w0": 1}
    assert compiled.overlap_by_worker([1, 2**64, 2]) == {"w0": 1}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-(2**70), 2**70) | BIG | st.sampled_from([-1, 2**64, 2**64 - 1]), max_size=20))
def test_the_compiled_range_check_names_the_first_bad_hash_as_python_does(hashes: list[int]) -> None:
    assert MODULE is not None
    assert MODULE.bad_hash(hashes) == indexer._bad_hash(hashes)
    assert MODULE.bad_hash(tuple(hashes)) == indexer._bad_hash(tuple(hashes))


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(st.integers(0, 40), st.floats(0, 10), max_size=30),
    st.lists(st.integers(0, 50), max_size=40),
)
def test_the_compiled_settle_drops_the_same_guesses_as_python(
    pending: dict[int, float], named: list[int]
) -> None:
    assert MODULE is not None
    mine, theirs = dict(pending), dict(pending)
    MODULE.settle(mine, named)
    indexer._settle(theirs, named)
    assert mine == theirs and list(mine) == list(theirs)


EDGES = [0, 1, 2**30 - 1, 2**30, 2**60 - 1, 2**60, 2**63, 2**64 - 1]
"""Hashes of one, two and three 30-bit digits at their edges (the compiled index reads an int's
digits itself)."""


@pytest.mark.parametrize("bad", [2**64, 2**64 + 2**60, 2**90, -1, -(2**62), "1"])
@pytest.mark.parametrize("at", [0, 3, 17, 40])
def test_every_64_bit_hash_is_read_and_a_lookup_ends_before_any_other(bad: object, at: int) -> None:
    compiled, plain = both()
    chain = EDGES * 6  # 48 blocks: past the hashes converted ahead of the walk
    for ix in (compiled, plain):
        apply_all(ix, [(5, stored(tuple(chain)))])
        assert ix.overlap_by_worker(chain) == {"w5": 48}
        query = chain[:at] + [bad] + chain[at:]
        assert ix.overlap_by_worker(query) == ({"w5": at} if at else {})  # type: ignore[arg-type]
        assert ix.overlap_masks(query) == ([(1 << 5, at)] if at else [])  # type: ignore[arg-type]
    if isinstance(bad, int):
        with pytest.raises(TransportError, match="is not a 64-bit unsigned int"):
            compiled.apply(KVEventBatch(instance_id="w1", seq=0, timestamp=0.0, events=(stored((1, bad)),)))


def test_many_workers_grow_the_masks_without_losing_blocks() -> None:
    ix = KvIndexer()
    ix.add_worker("first")
    apply_all_named(ix, "first", (1, 2, 3))
    for w in range(300):
        ix.add_worker(f"w{w}")
    apply_all_named(ix, "w299", (1, 2))
    ix.check_integrity()
    assert ix.overlap_by_worker([1, 2, 3]) == {"first": 3, "w299": 2}


def test_the_map_grows_in_steps_and_answers_as_a_dict_throughout() -> None:
    """Past 3/4 full the map moves into one twice its size a few slots per store or remove
    (``MIGRATE_STEP``), and from 2 MiB the next table is prepared by a thread: across several
    growths, stores, removes and lookups mid-way agree with a dict, and the invariants hold."""
    rng = random.Random(7)
    ix = MODULE.new(2)  # type: ignore[union-attr]
    model: dict[int, int] = {}
    held: list[int] = []
    for step in range(150):
        slot = rng.randrange(100)
        fresh = [rng.getrandbits(64) for _ in range(4000)]
        hashes = fresh + rng.sample(held, min(len(held), 300))
        MODULE.store(ix, slot, hashes)  # type: ignore[union-attr]
        for h in hashes:
            model[h] = model.get(h, 0) | 1 << slot
        held += fresh
        gone = rng.sample(held, 1500)
        slot = rng.randrange(100)
        MODULE.remove(ix, slot, gone)  # type: ignore[union-attr]
        for h in gone:
            if h in model and model[h] >> slot & 1:
                model[h] &= ~(1 << slot)
                if not model[h]:
                    del model[h]
        for h in rng.sample(held, 50) + [rng.getrandbits(64)]:
            assert MODULE.mask(ix, h) == model.get(h, 0)  # type: ignore[union-attr]
            assert MODULE.runs(ix, [h]) == ([(model[h], 1)] if h in model else [])  # type: ignore[union-attr]
        if step % 25 == 0 or step == 149:
            assert MODULE.check(ix) is None  # type: ignore[union-attr]
            assert MODULE.size(ix)[0] == len(model)  # type: ignore[union-attr]
    assert MODULE.items(ix) == model  # type: ignore[union-attr]
    while MODULE.migrate(ix, 1 << 12):  # type: ignore[union-attr]  # the tick ends a growth
        assert MODULE.check(ix) is None  # type: ignore[union-attr]
    assert MODULE.items(ix) == model  # type: ignore[union-attr]
    for slot in range(100):  # each slot's own set of what it holds
        mine = sorted(h for h, m in model.items() if m >> slot & 1)
        assert MODULE.count(ix, slot) == len(mine)  # type: ignore[union-attr]
        assert sorted(MODULE.blocks(ix, slot)) == mine  # type: ignore[union-attr]
    MODULE.remove(ix, 0, list(model))  # type: ignore[union-attr]
    for slot in range(1, 50):
        MODULE.remove(ix, slot, list(model))  # type: ignore[union-attr]
    for slot in range(50, 100):
        MODULE.clear(ix, slot)  # type: ignore[union-attr]
        assert MODULE.count(ix, slot) == 0 and MODULE.check(ix) is None  # type: ignore[union-attr]
    assert MODULE.check(ix) is None and MODULE.size(ix)[:2] == (0, 0)  # type: ignore[union-attr]


def test_a_slot_keeps_its_own_blocks_the_hash_0_included() -> None:
    ix = MODULE.new(1)  # type: ignore[union-attr]
    MODULE.store(ix, 3, [0, 5, 2**64 - 1, 5])  # type: ignore[union-attr]
    MODULE.store(ix, 4, [5])  # type: ignore[union-attr]
    assert MODULE.count(ix, 3) == 3 and sorted(MODULE.blocks(ix, 3)) == [0, 5, 2**64 - 1]  # type: ignore[union-attr]
    assert MODULE.check(ix) is None  # type: ignore[union-attr]
    MODULE.remove(ix, 3, [0])  # type: ignore[union-attr]
    assert sorted(MODULE.blocks(ix, 3)) == [5, 2**64 - 1]  # type: ignore[union-attr]
    MODULE.clear(ix, 3)  # type: ignore[union-attr]
    assert MODULE.blocks(ix, 3) == [] and MODULE.items(ix) == {5: 1 << 4}  # type: ignore[union-attr]
    assert MODULE.check(ix) is None  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="slot 64 out of range"):
        MODULE.count(ix, 64)  # type: ignore[union-attr]


def apply_all_named(ix: KvIndexer, wid: str, hashes: tuple[int, ...]) -> None:
    ix.apply(KVEventBatch(instance_id=wid, seq=0, timestamp=0.0, events=(stored(hashes),)))


# ---- the whole decision ----

FEW = st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0, 7.0, 100.0])


@st.composite
def decisions(draw: st.DrawFn) -> dict:
    n = WORKERS
    vec = lambda elem: np.array(draw(st.lists(elem, min_size=n, max_size=n)), dtype=np.float64)  # noqa: E731
    queued = vec(st.sampled_from([0.0, 16.0, 9000.0, 0.1, 1e15 / 3]))
    waiting = vec(FEW) if draw(st.booleans()) else None
    decoding = vec(st.sampled_from([0.0, 1.0, 3.0])) if draw(st.booleans()) else None
    if draw(st.booleans()):  # idle workers: nothing queued, waiting or decoding (cost._idle_replicas)
        quiet = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
        for v in (queued, waiting, decoding):
            if v is not None:
                v[quiet] = 0.0
    return {
        **left_slots(draw, queued),
        "params": CostParams(
            block_size=draw(st.sampled_from([1, 16])),
            chunk_tokens=draw(st.sampled_from([64, 100, 8192])),
            kv_watermark=draw(st.sampled_from([0.5, 1.0])),
            kv_penalty=draw(st.sampled_from([0.0, 4.0])),
            miss_weight=draw(st.sampled_from([1.0, 3.0])),
            decode_weight=draw(st.sampled_from([0.0, 0.15, 0.225])),
            backlog_charge=draw(st.booleans()),
            stall_weight=draw(st.sampled_from([0.0, 1.0, 0.5])),
            tie_tolerance_s=draw(st.sampled_from([0.0, 1e-3, 1.0])),
            idle_replicas=draw(st.booleans()),
        ),
        "prompt": draw(st.integers(1, 700)),
        "per_token": vec(st.sampled_from([1e-4, 5e-4])),
        "overhead": vec(st.sampled_from([0.01, 0.02])),
        "decode_step": vec(st.sampled_from([0.01, 0.03])),
        "decode_tokens": draw(st.sampled_from([0, 1, 200])),
        "kv": vec(st.sampled_from([0.0, 0.8, 1.0])),
        "waiting": waiting,
        "decoding": decoding,
        "room": draw(st.booleans()),
        "free": vec(st.sampled_from([0.0, 10.0, np.inf])),
        "used": vec(st.sampled_from([0.0, 20.0, 500.0])),
        "weight": vec(st.sampled_from([0.25, 1.0])) if draw(st.booleans()) else None,
        "eligible": np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
        if draw(st.booleans())
        else None,
        "busy": vec(st.sampled_from([0.0, 1.0, 2.0])),
        "rotation": draw(st.integers(0, 1000)),
        "k": draw(st.integers(1, 6)),
    }


@settings(max_examples=150, deadline=None)
@given(events(), decisions(), st.sampled_from(CHAINS), st.integers(0, 30))
def test_the_compiled_decision_equals_numpy_over_the_dict(evs, c, chain, cut) -> None:
    check_decision(evs, c, chain[:cut] + [7])


def test_the_compiled_decision_prices_idle_replicas_as_numpy() -> None:
    """``cost._idle_replicas`` through the compiled index's decision: a prefix ten workers hold,
    a third of the workers idle."""
    rng = np.random.default_rng(3)
    chain = CHAINS[0]
    evs = [(w, stored(tuple(chain[:12]))) for w in range(0, 30, 3)] + [(40, stored(tuple(chain[:5])))]
    for trial in range(60):
        quiet = rng.random(WORKERS) < 0.35
        queued, waiting, decoding = (
            np.where(quiet, 0.0, rng.choice([16.0, 300.0], WORKERS)) for _ in range(3)
        )
        c = {
            "queued": queued, "fleet": None, "params": CostParams(block_size=16, idle_replicas=trial % 4 != 0),
            "prompt": 400, "per_token": rng.choice([1e-4, 5e-4], WORKERS), "overhead": np.full(WORKERS, 0.01),
            "decode_step": np.full(WORKERS, 0.02), "decode_tokens": 200, "kv": np.zeros(WORKERS),
            "waiting": waiting, "decoding": decoding, "room": trial % 2 == 0, "free": np.full(WORKERS, 1e6),
            "used": np.full(WORKERS, 20.0), "weight": None, "eligible": None, "busy": np.zeros(WORKERS),
            "rotation": trial, "k": 4,
        }  # fmt: skip
        check_decision(evs, c, [*chain[:20], 7])


def check_decision(evs: list[tuple[int, object]], c: dict, hashes: list[int]) -> None:
    """The compiled index's whole decision equals numpy's, bit for bit."""
    compiled, plain = both()
    apply_all(compiled, evs)
    apply_all(plain, evs)
    p: CostParams = c["params"]
    overlaps = plain.overlaps(hashes, WORKERS)
    costs, want_ranked, want = numpy_decision(
        {**c, "n": WORKERS, "overlaps": overlaps, "lower": None, "load_s": None}
    )
    kernel = RouteKernel(None)
    vectors = (
        c["queued"],
        c["per_token"],
        c["overhead"],
        c["waiting"],
        c["decode_step"],
        c["kv"],
        c["free"] if c["room"] else None,
        c["used"] if c["room"] else None,
        c["busy"],
        c["decoding"],
    )
    got_costs, ranked, slot, got_overlaps = kernel.decide_indexed(
        compiled,
        hashes,
        p,
        WORKERS,
        c["prompt"],
        c["decode_tokens"],
        c["decode_tokens"],
        c["k"],
        c["rotation"],
        vectors,
        c["weight"],
        c["eligible"],
        WORKERS if c["fleet"] is None else c["fleet"],
    )
    np.testing.assert_array_equal(got_overlaps, overlaps)
    np.testing.assert_array_equal(got_costs, costs)  # bit for bit
    assert (slot, ranked) == (want, want_ranked)


def test_the_compiled_decision_names_a_wrong_vector() -> None:
    compiled, _ = both()
    ok = np.zeros(WORKERS)
    kernel = RouteKernel(None)
    bad = (ok, np.zeros(WORKERS, dtype=np.float32), ok, None, ok, ok, None, None, ok, None)
    with pytest.raises(TypeError, match="per_token must be a contiguous float64 vector of at least 70"):
        kernel.decide_indexed(
            compiled, [1], CostParams(), WORKERS, 10, 1, 1, MAX_RANKED, 0, bad, None, None, WORKERS
        )
    good = (ok, ok, ok, None, ok, ok, None, None, ok, None)
    for fleet in (0, WORKERS + 1):
        with pytest.raises(ValueError, match=f"fleet must be in 1..70 workers, got {fleet}"):
            kernel.decide_indexed(
                compiled, [1], CostParams(), WORKERS, 10, 1, 1, 3, 0, good, None, None, fleet
            )


def test_a_nan_shortfall_prices_no_wait_for_room_as_numpy_does() -> None:
    # numpy's argmax finds the NaN, so no worker is priced a wait; a running maximum that
    # skipped the NaN would price one for the worker that lacks room
    compiled, _ = both()
    n = WORKERS
    ones, zeros = np.ones(n), np.zeros(n)
    free = np.full(n, 1e9)
    free[0], free[1] = np.nan, 0.0
    used = np.full(n, 10.0)
    p = CostParams()
    want = ttft_costs(
        p,
        prompt_tokens=64,
        uncached_tokens=np.full(n, 64.0),
        queued_prefill=zeros,
        per_token_s=ones * 1e-4,
        step_overhead_s=ones * 0.01,
        decode_step_s=ones * 0.02,
        kv_usage=zeros,
        decode_tokens=8,
        free_blocks=free,
        used_blocks=used,
        drain_s=ones * 0.02 * 8,
    )
    vectors = (zeros, ones * 1e-4, ones * 0.01, None, ones * 0.02, zeros, free, used, zeros, None)
    costs, ranked, slot, _ = RouteKernel(None).decide_indexed(
        compiled, [], p, n, 64, 8, 8, 3, 0, vectors, None, None, n
    )
    np.testing.assert_array_equal(costs, want)
    everyone = np.ones(n, dtype=bool)
    assert ranked == cheapest(want, None, 3)
    assert slot == choose(want, everyone, zeros, tolerance=p.tie_tolerance_s, ranked=ranked)


EXTREME = st.sampled_from([0.0, 1.0, 8191.0, 8192.0, 8193.0, 16384.0, 3e15, 1e300, np.inf, np.nan])


@settings(max_examples=100, deadline=None)
@given(
    st.lists(EXTREME, min_size=WORKERS, max_size=WORKERS),
    st.lists(st.sampled_from([0.0, 5.0, np.inf, np.nan, -3.0]), min_size=WORKERS, max_size=WORKERS),
    st.integers(1, 9000),
)
def test_the_usual_terms_cost_the_same_at_the_edges(queued, free, prompt) -> None:
    # The router's defaults (queue depth, decode time, the wait for room; chunk and block size
    # powers of two) take route_kv's AVX2 first pass where the CPU has one: the same doubles as
    # numpy at chunk boundaries, past 2^52, at infinities and NaNs.
    compiled, _ = both()
    n, p = WORKERS, CostParams()
    ones = np.ones(n)
    q, f = np.array(queued), np.array(free)
    waiting, step, used = ones * 2.0, ones * 0.02, ones * 30.0
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf: NaN, as intended here
        want = _usual_costs(p, prompt, q, f, waiting, step, used)
    vectors = (q, ones * 1e-4, ones * 0.01, waiting, step, ones * 0.5, f, used, ones, ones * 3.0)
    costs, _, _, _ = RouteKernel(None).decide_indexed(
        compiled, [], p, n, prompt, 100, 100, 3, 0, vectors, None, None, n
    )
    np.testing.assert_array_equal(costs, want)


def _usual_costs(p, prompt, q, f, waiting, step, used):  # type: ignore[no-untyped-def]
    ones = np.ones(len(q))
    return ttft_costs(
        p,
        prompt_tokens=prompt,
        uncached_tokens=np.full(len(q), float(max(prompt, 1))),
        queued_prefill=q,
        per_token_s=ones * 1e-4,
        step_overhead_s=ones * 0.01,
        decode_step_s=step,
        kv_usage=ones * 0.5,
        decode_tokens=100,
        waiting=waiting,
        decoding=ones * 3.0,
        free_blocks=f,
        used_blocks=used,
        drain_s=step * 100,
    )


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.floats(0.0, 1.0), min_size=WORKERS, max_size=WORKERS),
    st.floats(1e-4, 0.1),
    st.one_of(st.none(), st.floats(1e-4, 0.1)),
)
def test_the_decode_step_from_its_terms_is_numpys(context, mul, add) -> None:
    # LoadTracker.cost_vectors hands the decode step as (vector, mul, add): computed in C, it
    # must be the vector LoadTracker.decode_step makes with numpy
    compiled, _ = both()
    n, p = WORKERS, CostParams()
    ones, vector = np.ones(n), np.array(context)
    step = vector * mul
    if add is not None:
        step += add
    free, used = ones * 3.0, ones * 40.0
    base = (ones * 500.0, ones * 1e-4, ones * 0.01, ones, None, ones * 0.5, free, used, ones, ones)
    kernel = RouteKernel(None)

    def costs(decode: object) -> np.ndarray:
        vectors = base[:4] + (decode,) + base[5:]
        return kernel.decide_indexed(compiled, [], p, n, 64, 300, 300, 3, 0, vectors, None, None, n)[0].copy()

    assert costs((vector, mul, add)).tobytes() == costs(step).tobytes()
    # without the stall (no decoding vector: the AVX2 first pass without it)
    base = base[:9] + (None,)
    assert costs((vector, mul, add)).tobytes() == costs(step).tobytes()
    # with the usual terms' AVX2 first pass off (no waiting vector: the scalar loop)
    base = base[:3] + (None,) + base[4:]
    assert costs((vector, mul, add)).tobytes() == costs(step).tobytes()


def test_a_staircase_of_prefixes_gives_a_run_per_worker_in_the_decision() -> None:
    # worker w holds the first w + 1 blocks: the lookup nests 70 runs, one per worker
    compiled, plain = both()
    chain = list(range(1, WORKERS + 1))
    evs = [(w, stored(tuple(chain[: w + 1]))) for w in range(WORKERS)]
    apply_all(compiled, evs)
    apply_all(plain, evs)
    assert len(compiled.overlap_masks(chain)) == WORKERS
    n, ones = WORKERS, np.ones(WORKERS)
    vectors = (ones * 0.0, ones * 1e-4, ones * 0.01, None, ones * 0.02, ones * 0.5, None, None, ones, None)
    p = CostParams(block_size=1, tie_tolerance_s=0.0)
    costs, ranked, slot, overlaps = RouteKernel(None).decide_indexed(
        compiled, chain, p, n, 1000, 1, 1, 3, 0, vectors, None, None, n
    )
    np.testing.assert_array_equal(overlaps, plain.overlaps(chain, n))
    assert ranked == [WORKERS - 1, WORKERS - 2, WORKERS - 3] and slot == WORKERS - 1  # the longest prefix
