"""The router's decision equals the plain definitions: the reference decider's costs
(``kv_decide``) equal ``ttft_costs`` over state vectors rebuilt from scratch, bit for bit; shortcuts in ``ttft_costs``
(one step per worker, no wait for room) and in ``choose`` (a clear winner) change nothing."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from interlock.errors import NoWorkers
from interlock.protocol.discovery import InstanceInfo
from interlock.protocol.events import BlockStored, KVEventBatch, LoadReport
from interlock.router import Decision, RequestMeta, Router, RouterConfig
from interlock.router.cost import CostParams, cheapest, choose, room_wait_s, ttft_costs
from interlock.router.kv_decide import KvRequest, ReferenceDecider
from interlock.router.load import DECODE_CONTEXT_SLOPE, MAX_DECODE_CONTEXT

BS = 16


def fleet(n: int, rng: random.Random) -> tuple[Router, list[list[int]]]:
    r = Router(RouterConfig(block_size=BS, seed=0, share_load=False))
    for i in range(n):
        r.add_worker(
            InstanceInfo(instance_id=f"w{i}", endpoint="e", model="m", block_size=BS, kv_blocks_total=3000)
        )
    prefixes = [[rng.getrandbits(63) for _ in range(rng.randint(4, 40))] for _ in range(6)]
    seqs = dict.fromkeys(range(n), -1)
    for _ in range(8 * n):
        w = rng.randrange(n)
        head = rng.choice(prefixes)
        chain = head[: rng.randint(1, len(head))] + [rng.getrandbits(63) for _ in range(rng.randint(0, 20))]
        seqs[w] += 1
        ev = BlockStored(block_hashes=tuple(chain), parent_block_hash=None)
        r.apply_events(KVEventBatch(instance_id=f"w{w}", seq=seqs[w], timestamp=0.0, events=(ev,)))
    return r, prefixes


def report(w: int, t: float, rng: random.Random) -> LoadReport:
    tokens = rng.randint(64, 12_000)
    return LoadReport(
        instance_id=f"w{w}",
        timestamp=t,
        num_running=rng.randint(1, 30),
        num_waiting=rng.randint(0, 2),
        kv_blocks_used=rng.randint(0, 2990),
        kv_blocks_total=3000,
        queued_prefill_tokens=rng.choice((0, rng.randint(1, 30_000))),
        step_time_s=0.01 + tokens * 2e-5 * rng.uniform(0.9, 1.1),
        tokens_computed=tokens,
        decode_step_s=rng.uniform(0.01, 0.04),
    )


def reference_costs(r: Router, meta: RequestMeta, hashes: list[int]) -> np.ndarray:
    """The ``kv`` cost with every vector built from the tracker's state the plain way."""
    lt, n = r.load, r.indexer.num_slots
    line = lt._decode_fit.estimate(min_spread_tokens=0.01) or lt._decode_line  # kept once fitted
    context = np.minimum(lt.dispatched_kv * lt.inv_kv_tokens, MAX_DECODE_CONTEXT)
    if line is None:
        measured = lt.decode_measured
        base = lt.decode_step_s[measured].min() if measured.any() else 0.02
        decode = base * (1.0 + DECODE_CONTEXT_SLOPE * context)
    else:
        decode = line[0] + line[1] * context
    total = lt.kv_tokens_total / BS
    used = lt.kv_used_frac * total
    free = np.where(total > 0, total - used, np.inf)
    overhead, per_token = lt.speeds()
    return ttft_costs(
        r.config.cost,
        prompt_tokens=meta.prompt_tokens,
        overlap_blocks=r.indexer.overlaps(hashes, n),
        queued_prefill=(lt.reported_prefill + lt.fresh_prefill)[:n],
        per_token_s=per_token[:n],
        step_overhead_s=overhead[:n],
        decode_step_s=decode[:n],
        kv_usage=lt.kv_used_frac[:n],
        decode_tokens=meta.max_tokens,
        waiting=lt.reported_waiting[:n],
        decoding=lt.decoding[:n],
        free_blocks=free[:n],
        used_blocks=used[:n],
        drain_s=decode[:n] * max(meta.max_tokens, 1),
    )


def test_decisions_cost_exactly_what_the_plain_definitions_give() -> None:
    rng = random.Random(7)
    r, prefixes = fleet(96, rng)
    t = 0.0
    for i in range(150):
        t += 0.01
        for w in rng.sample(range(96), 5):
            r.apply_load(report(w, t, rng))
        head = rng.choice(prefixes)
        hashes = head[: rng.randint(0, len(head))] + [rng.getrandbits(63) for _ in range(rng.randint(0, 30))]
        meta = RequestMeta(
            request_id=f"r{i}",
            prompt_tokens=max(len(hashes) * BS - rng.randrange(BS), 1),
            max_tokens=rng.randint(1, 600),
        )
        n = r.indexer.num_slots
        mask = np.ones(n, dtype=bool)
        req = KvRequest(hashes, meta.prompt_tokens, meta.max_tokens, mask, True, None, 0, 96)
        got = ReferenceDecider(r.indexer, r.load, r.config.cost, 3, np.random.default_rng(0)).costs(
            req, r.indexer.overlaps(hashes, n)
        )
        assert np.array_equal(got, reference_costs(r, meta, hashes))
        d = r.route(meta, block_hashes=hashes, may_wait=False)  # costs are the point, not waits
        assert isinstance(d, Decision)
        assert d.overlap_blocks == r.indexer.overlaps(hashes)[r.indexer.slot_of(d.worker_id)]
        if i % 3:
            r.on_finish(meta.request_id)
    r.load.check_derived()


vec = st.lists(st.floats(0, 1e4, allow_nan=False), min_size=6, max_size=6).map(np.array)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 40), min_size=6, max_size=6).map(np.array),
    st.integers(1, 700),
    vec,
    st.sampled_from([64, 512, 8192]),
    st.lists(st.floats(0, 60, allow_nan=False), min_size=6, max_size=6).map(np.array),
    st.integers(0, 300),
    st.one_of(st.none(), st.lists(st.integers(0, 30), min_size=6, max_size=6).map(np.array)),
    st.one_of(st.none(), st.lists(st.integers(0, 30), min_size=6, max_size=6).map(np.array)),
)
def test_ttft_costs_shortcuts_equal_the_formula(
    overlap, prompt, queued, chunk, free, max_tokens, waiting, decoding
) -> None:
    params = CostParams(block_size=BS, chunk_tokens=chunk)
    per_token = np.linspace(1e-5, 3e-5, 6)
    overhead = np.linspace(0.01, 0.03, 6)
    decode = np.linspace(0.01, 0.05, 6)
    used = np.linspace(0.0, 40.0, 6)
    drain = decode * max(max_tokens, 1)
    got = ttft_costs(
        params,
        prompt_tokens=prompt,
        uncached_tokens=np.maximum(prompt - overlap * BS, 1).astype(float),
        queued_prefill=queued,
        per_token_s=per_token,
        step_overhead_s=overhead,
        decode_step_s=decode,
        kv_usage=np.zeros(6),
        decode_tokens=max_tokens,
        waiting=waiting,
        decoding=decoding,
        free_blocks=free,
        used_blocks=used,
        drain_s=drain,
    )
    # the module docstring's formula, term by term
    uncached = np.maximum(prompt - overlap * BS, 1)
    work = queued + uncached
    behind = 1.0 + queued.mean() / chunk  # the fleet's backlog in chunks
    if waiting is not None:
        behind = behind + waiting
        shared = uncached.min() < uncached.max() and (uncached == uncached.min()).sum() >= 2
        if decoding is not None and shared:  # idle replicas: the next request not charged
            behind = behind - ((decoding == 0) & (queued == 0) & (waiting == 0))
    want = (work + params.miss_weight * behind * uncached) * per_token
    want += np.ceil(work / chunk) * overhead
    if decoding is not None:
        want += np.ceil(uncached / chunk) * overhead * decoding * params.stall_weight
    if max_tokens:
        want += params.decode_weight * max_tokens * decode
    want += room_wait_s(need_blocks=work / BS, free_blocks=free, used_blocks=used, drain_s=drain)
    assert np.array_equal(got, want)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from([0.1, 0.2, 0.2005, 0.3, 0.5]), min_size=1, max_size=8),
    st.data(),
)
def test_choose_with_ranked_and_cheapest_agree_with_the_plain_choice(costs, data) -> None:
    c = np.array(costs)
    eligible = np.array(data.draw(st.lists(st.booleans(), min_size=len(c), max_size=len(c))))
    if not eligible.any():
        eligible[0] = True
    busy = np.array(data.draw(st.lists(st.integers(0, 2), min_size=len(c), max_size=len(c))), dtype=float)
    rotation = data.draw(st.integers(0, 5))
    ranked = cheapest(c, eligible, 3)
    idx = np.flatnonzero(eligible)
    assert ranked == sorted(idx.tolist(), key=lambda i: (c[i], i))[:3]
    assert cheapest(c, None, 3) == sorted(range(len(c)), key=lambda i: (c[i], i))[:3]
    plain = choose(c, eligible, busy, tolerance=1e-3, rotation=rotation)
    assert choose(c, eligible, busy, tolerance=1e-3, rotation=rotation, ranked=ranked) == plain
    # the plain rule: among eligible within tolerance of the best, the least busy, by rotation
    tied = idx[c[idx] <= c[idx].min() + 1e-3]
    tied = tied[busy[tied] == busy[tied].min()]
    assert plain == tied[rotation % len(tied)]


def test_no_worker_or_none_eligible_is_still_refused_with_the_shortcuts() -> None:
    r = Router(RouterConfig(block_size=BS))
    meta = RequestMeta(request_id="a", prompt_tokens=40)
    with pytest.raises(NoWorkers):
        r.route(meta, block_hashes=[1, 2])
    r.add_worker(InstanceInfo(instance_id="w0", endpoint="e", model="m", block_size=BS, kv_blocks_total=100))
    assert r.route(meta, block_hashes=[1, 2]).worker_id == "w0"
    r.set_health("w0", False)
    with pytest.raises(NoWorkers):
        r.route(RequestMeta(request_id="b", prompt_tokens=40), block_hashes=[1, 2])
