from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from interlock.errors import ConfigError
from interlock.router.cost import CostParams, choose, room_wait_s, ttft_costs


def costs(params: CostParams, **over) -> np.ndarray:
    n = 3
    kw = dict(
        prompt_tokens=1000,
        overlap_blocks=np.zeros(n),
        queued_prefill=np.zeros(n),
        per_token_s=np.full(n, 1e-4),
        step_overhead_s=np.full(n, 0.01),
        decode_step_s=np.full(n, 0.02),
        kv_usage=np.zeros(n),
        decode_tokens=0,
    )
    kw.update(over)
    return ttft_costs(params, **kw)


def test_cost_is_seconds_of_prefill_ahead_plus_step_overheads() -> None:
    p = CostParams(block_size=100, chunk_tokens=500, miss_weight=0.0, decode_weight=0.0)
    c = costs(p, overlap_blocks=np.array([0, 5, 10]), queued_prefill=np.array([0, 0, 2000]))
    # uncached 1000 / 500 / 1 (at least one token), plus 2 / 1 / 5 steps of 10 ms
    assert np.allclose(c, [0.1 + 0.02, 0.05 + 0.01, (2000 + 1) * 1e-4 + 0.05])


def test_miss_weight_and_decode_weight() -> None:
    p = CostParams(block_size=100, miss_weight=1.0, decode_weight=0.5)
    c = costs(
        p, overlap_blocks=np.array([0, 5, 0]), decode_tokens=10, decode_step_s=np.array([0.02, 0.02, 0.04])
    )
    assert np.allclose(c, [0.2 + 0.01 + 0.1, 0.1 + 0.01 + 0.1, 0.2 + 0.01 + 0.2])


def test_a_miss_is_charged_once_more_per_request_waiting_on_the_worker() -> None:
    p = CostParams(block_size=100, miss_weight=1.0, decode_weight=0.0)
    c = costs(p, overlap_blocks=np.array([0, 5, 10]), waiting=np.array([3, 3, 0]))
    # uncached 1000 / 500 / 1 prefill tokens, each charged for itself and 1 + 3 / 1 + 3 / 1 more
    assert np.allclose(c, [(1000 + 4 * 1000) * 1e-4 + 0.01, (500 + 4 * 500) * 1e-4 + 0.01, 2e-4 + 0.01])


def test_a_saturated_fleet_keeps_a_request_on_its_cache() -> None:
    # every queue is seconds long: 30,000 tokens more ahead on the worker holding the prompt's
    # 8,000-token prefix. Idle queues would be balanced (the hit saves less than the queue
    # costs); with 40 requests waiting everywhere the miss delays them all, so the hit wins.
    p = CostParams(block_size=100, miss_weight=1.0, decode_weight=0.0, backlog_charge=False)
    kw = dict(prompt_tokens=9000, overlap_blocks=np.array([80, 0, 0]))
    queued = np.array([80_000.0, 50_000.0, 50_000.0])
    assert np.argmin(costs(p, queued_prefill=queued, **kw)) == 1
    assert np.argmin(costs(p, queued_prefill=queued, waiting=np.full(3, 40), **kw)) == 0


def test_a_miss_is_charged_once_more_per_chunk_of_the_fleets_mean_queue() -> None:
    # a saturated engine admits its backlog (nothing waits): the fleet's queues, 60,000 tokens
    # on average, are what a miss delays, wherever it lands
    p = CostParams(block_size=100, chunk_tokens=8000, miss_weight=1.0, decode_weight=0.0)
    queued = np.array([80_000.0, 50_000.0, 50_000.0])
    kw = dict(prompt_tokens=9000, overlap_blocks=np.array([80, 0, 0]), queued_prefill=queued)
    c = costs(p, waiting=np.zeros(3), **kw)
    behind = 1.0 + 60_000 / 8000
    assert np.allclose(c[1], (59_000 + behind * 9000) * 1e-4 + 8 * 0.01)
    assert np.argmin(c) == 0  # the hit wins
    off = costs(replace(p, backlog_charge=False), waiting=np.zeros(3), **kw)
    assert np.argmin(off) == 1  # the shorter queue wins without it
    # no backlog anywhere: the same cost as without the charge, bit for bit
    idle = dict(kw, queued_prefill=np.zeros(3))
    assert np.array_equal(costs(p, **idle), costs(replace(p, backlog_charge=False), **idle))


def test_the_backlog_is_the_mean_over_the_fleets_workers_not_its_empty_slots() -> None:
    # three workers left of eight slots (the others left: queue 0): priced as three workers
    p = CostParams(block_size=100, chunk_tokens=8000, miss_weight=1.0, decode_weight=0.0)
    queued = np.array([80_000.0, 50_000.0, 50_000.0])
    kw = dict(prompt_tokens=9000, waiting=np.zeros(3))
    three = costs(p, overlap_blocks=np.array([80, 0, 0]), queued_prefill=queued, **kw)
    n = 8
    slots = dict(
        overlap_blocks=np.array([80, 0, 0, 0, 0, 0, 0, 0]),
        queued_prefill=np.concatenate([queued, np.zeros(n - 3)]),
        per_token_s=np.full(n, 1e-4),
        step_overhead_s=np.full(n, 0.01),
        decode_step_s=np.full(n, 0.02),
        kv_usage=np.zeros(n),
        waiting=np.zeros(n),
        prompt_tokens=9000,
    )
    assert costs(p, **slots, backlog_workers=3)[:3].tobytes() == three.tobytes()
    diluted = costs(p, **slots)  # every slot counted: 22,500 tokens on average, not 60,000
    assert np.allclose(diluted[1], (59_000 + (1 + 22_500 / 8000) * 9000) * 1e-4 + 8 * 0.01)


def test_a_prefill_is_charged_the_steps_it_stalls_each_decoding_request() -> None:
    # the prompt's holder has 6 requests decoding, the others 1: each prefill step there costs
    # each of them a step overhead (10 ms) between two tokens
    p = CostParams(block_size=100, chunk_tokens=500, miss_weight=0.0, decode_weight=0.0, stall_weight=1.0)
    kw = dict(overlap_blocks=np.array([9, 0, 0]), decoding=np.array([6, 1, 1]))
    c = costs(p, **kw)
    # uncached 100 / 1000 / 1000 tokens: 1 / 2 / 2 prefill steps
    assert np.allclose(c, [0.01 + 0.01 + 6 * 0.01, 0.1 + 0.02 + 2 * 0.01, 0.1 + 0.02 + 2 * 0.01])
    assert np.argmin(c) == 0  # the hit still wins at 6 ...
    c = costs(p, overlap_blocks=np.array([9, 0, 0]), decoding=np.array([14, 1, 1]))
    assert np.argmin(c) == 1  # ... not at 14
    assert np.array_equal(
        costs(replace(p, stall_weight=0.0), **kw), costs(p, overlap_blocks=kw["overlap_blocks"])
    )


def test_a_miss_on_an_idle_worker_of_a_prefix_others_share_is_not_charged_for_the_next_request() -> None:
    # four workers: two hold the prompt's 900-token prefix and decode, one is idle, one is busy
    p = CostParams(
        block_size=100,
        chunk_tokens=2000,
        miss_weight=3.0,
        decode_weight=0.0,
        stall_weight=0.0,
        backlog_charge=False,
    )
    n = 4
    kw = dict(
        overlap_blocks=np.array([9, 9, 0, 0]),
        queued_prefill=np.zeros(n),
        per_token_s=np.full(n, 1e-4),
        step_overhead_s=np.full(n, 0.01),
        decode_step_s=np.full(n, 0.02),
        kv_usage=np.zeros(n),
        waiting=np.zeros(n),
        decoding=np.array([3.0, 3.0, 0.0, 1.0]),
    )
    c = ttft_costs(p, prompt_tokens=1000, **kw)
    # the holders: 100 tokens, charged for the next request too; the busy worker: 1000 tokens,
    # the same; the idle one: 1000 tokens, charged for itself only (no one waits behind it)
    assert np.allclose(c, [(100 + 3 * 100) * 1e-4 + 0.01] * 2 + [1000 * 1e-4 + 0.01, 4 * 1000 * 1e-4 + 0.01])
    off = ttft_costs(replace(p, idle_replicas=False), prompt_tokens=1000, **kw)
    assert np.allclose(off[2], off[3]) and np.array_equal(off[[0, 1, 3]], c[[0, 1, 3]])
    # one worker holds the prefix (a session's own context): the copy would serve it alone
    alone = dict(kw, overlap_blocks=np.array([9, 0, 0, 0]))
    assert np.array_equal(
        ttft_costs(p, prompt_tokens=1000, **alone),
        ttft_costs(replace(p, idle_replicas=False), prompt_tokens=1000, **alone),
    )
    # something queued or waiting there: not idle
    for busy in ({"queued_prefill": np.array([0, 0, 16.0, 0])}, {"waiting": np.array([0, 0, 1.0, 0])}):
        c = ttft_costs(p, prompt_tokens=1000, **{**kw, **busy})
        assert c[2] > (1000 + 3 * 1000) * 1e-4


def test_kv_usage_above_watermark_raises_cost() -> None:
    p = CostParams(kv_watermark=0.7, kv_penalty=4.0)
    c = costs(p, kv_usage=np.array([0.5, 0.85, 1.0]))
    assert c[0] < c[1] < c[2]
    assert np.isclose(c[1], c[0] * 3.0) and np.isclose(c[2], c[0] * 5.0)


def test_choose_breaks_ties_away_from_the_busiest_and_respects_eligibility() -> None:
    c = np.array([1.0, 1.0005, 1.0, 2.0])
    busy = np.array([5, 1, 3, 0])
    elig = np.array([True, True, True, True])
    assert choose(c, elig, busy, tolerance=1e-3) == 1
    assert choose(c, np.array([True, False, True, True]), busy, tolerance=1e-3) == 2
    assert choose(c, np.array([False, False, False, True]), busy, tolerance=1e-3) == 3


def test_temperature_samples_cheap_workers_more_often() -> None:
    rng = np.random.default_rng(0)
    c = np.array([0.1, 0.2, 1.0])
    picks = [
        choose(c, np.ones(3, bool), np.zeros(3), tolerance=0, temperature=0.3, rng=rng) for _ in range(500)
    ]
    counts = np.bincount(picks, minlength=3)
    assert counts[0] > counts[1] > counts[2] > 0


def test_params_are_validated() -> None:
    with pytest.raises(ConfigError):
        CostParams(kv_watermark=0.0)
    with pytest.raises(ConfigError):
        CostParams(temperature=-1)
    with pytest.raises(ConfigError, match="stall_over"):
        CostParams(stall_over="queued")


def test_room_wait_is_the_deficit_released_at_the_rate_blocks_in_use_free() -> None:
    wait = room_wait_s(
        need_blocks=np.array([50.0, 150.0, 150.0]),
        free_blocks=np.array([100.0, 100.0, np.inf]),
        used_blocks=np.array([900.0, 900.0, 0.0]),
        drain_s=np.array([9.0, 9.0, 9.0]),
    )
    assert list(wait) == [0.0, 0.5, 0.0]  # 50 of 900 blocks in use, all freed in 9 s
