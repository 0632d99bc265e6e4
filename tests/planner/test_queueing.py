from __future__ import annotations

import math

import numpy as np
import pytest

from interlock.planner.queueing import PrefillSample, arrival_ca2, erlang_c, ttft_miss, workers_for_ttft

TTFT = 2.0
ALLOWED = 0.015


def exponential(mean: float, n: int = 4000) -> np.ndarray:
    """An exponential sample without noise: its quantiles at (i + 0.5) / n."""
    return np.asarray(-mean * np.log1p(-(np.arange(n) + 0.5) / n))


def poisson(times: np.ndarray) -> PrefillSample:
    return PrefillSample(times, 1.0)


def test_one_worker_with_poisson_arrivals_and_exponential_prompts_is_mm1() -> None:
    s = poisson(exponential(0.16))
    for rate in (3.5, 5.0, 5.8):
        mm1 = math.exp(-(1 / s.mean - rate) * TTFT)  # the M/M/1 time in system
        assert ttft_miss(s, rate, 1, TTFT) == pytest.approx(mm1, rel=0.02)
    assert erlang_c(1, 0.5) == pytest.approx(0.5)
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)  # M/M/2 at half load
    assert erlang_c(3, 3.0) == 1.0


def test_a_pool_pools() -> None:
    # one queue for the pool: twice the traffic needs fewer than twice the workers, and fewer
    # than as many separate M/M/1 queues
    s = poisson(exponential(0.16))
    one = workers_for_ttft(s, 5.0, TTFT, ALLOWED)
    two = workers_for_ttft(s, 10.0, TTFT, ALLOWED)
    assert 1 < one and two < 2 * one and two < 10.0 / (1 / s.mean + math.log(ALLOWED) / TTFT)
    shares = [ttft_miss(s, 10.0, n, TTFT) for n in range(1, 8)]
    assert shares == sorted(shares, reverse=True) and shares[0] == 1.0  # 1.6 erlangs on one


def test_heavy_tailed_prompts_and_bursty_arrivals_need_more_workers() -> None:
    # the same mean prefill time (0.15 s): equal prompts, or 95% short and 5% eleven times longer
    equal = np.full(400, 0.15)
    heavy = np.array([0.1] * 380 + [1.1] * 20)
    rate = 6.0
    assert workers_for_ttft(poisson(heavy), rate, TTFT, ALLOWED) > workers_for_ttft(
        poisson(equal), rate, TTFT, ALLOWED
    )
    # a trough of a conversation trace: requests in bursts (gaps' squared CV 9, as Mooncake's)
    bursty = PrefillSample(heavy, 9.0)
    assert workers_for_ttft(bursty, rate, TTFT, ALLOWED) > 1.4 * workers_for_ttft(
        poisson(heavy), rate, TTFT, ALLOWED
    )


def test_prompts_no_pool_serves_in_time_are_allowed_on_top() -> None:
    # 3% of prompts take longer than the target alone: more than the 1.5% allowed, and no
    # pool size helps them, so they do not make the rest unservable
    s = poisson(np.array([0.1] * 97 + [2.5] * 3))
    assert ttft_miss(s, 0.0, 1, TTFT) == pytest.approx(0.03)
    n = workers_for_ttft(s, 10.0, TTFT, ALLOWED)
    assert math.isfinite(n) and ttft_miss(s, 10.0, math.ceil(n), TTFT) <= 0.03 + ALLOWED


def test_the_need_moves_smoothly_with_the_rate() -> None:
    s = PrefillSample(exponential(0.16, 1000), 4.0)
    needs = [workers_for_ttft(s, r / 4, TTFT, ALLOWED) for r in range(1, 200)]
    assert needs == sorted(needs)
    assert max(b - a for a, b in zip(needs, needs[1:], strict=False)) < 0.5
    assert workers_for_ttft(s, 0.0, TTFT, ALLOWED) == 0.0


def test_arrival_burstiness_is_read_within_stretches_of_steady_rate() -> None:
    even = [i * 0.5 for i in range(200)]
    assert arrival_ca2(even) == pytest.approx(0.0)
    # a rate that doubles after a minute is not burstiness
    ramp = [i * 0.5 for i in range(120)] + [60 + i * 0.25 for i in range(240)]
    assert arrival_ca2(ramp) < 0.05
    # four requests at one instant every two seconds
    bursts = [2.0 * (i // 4) for i in range(200)]
    assert arrival_ca2(bursts) > 2.5
    assert arrival_ca2([1.0, 2.0]) == 1.0  # too few to tell
