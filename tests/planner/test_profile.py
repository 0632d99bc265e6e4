from __future__ import annotations

import math

import numpy as np
import pytest

from interlock.planner.profile import mg1_rate, ttft_miss
from tests.planner.conftest import mock_profile

TTFT = 2.0
ALLOWED = 0.015


def exponential(mean: float, n: int = 4000) -> np.ndarray:
    """An exponential sample without noise: its quantiles at (i + 0.5) / n."""
    q = (np.arange(n) + 0.5) / n
    return np.asarray(-mean * np.log1p(-q))


def test_mg1_is_the_mm1_line_for_exponential_prefill_times() -> None:
    mm1 = 1 / 0.16 + math.log(ALLOWED) / TTFT
    assert mg1_rate(exponential(0.16), TTFT, ALLOWED) == pytest.approx(mm1, rel=0.01)
    p = mock_profile()
    times = exponential(p.prefill_s(6000))
    assert p.prefill_rate_of(times, TTFT, 1 - ALLOWED) == pytest.approx(
        p.prefill_rate(6000, TTFT, 1 - ALLOWED), rel=0.01
    )


def test_a_heavy_tailed_mix_serves_fewer_requests_per_worker_than_its_mean() -> None:
    # the same mean prefill time (0.15 s): 95% short prompts and 5% eleven times longer
    mix = np.array([0.1] * 95 + [1.1] * 5)
    same = np.full(100, 0.15)
    mm1 = 1 / 0.15 + math.log(ALLOWED) / TTFT
    assert mg1_rate(mix, TTFT, ALLOWED) < 0.85 * mm1
    assert mg1_rate(same, TTFT, ALLOWED) > 1.1 * mm1  # no spread: less queueing than M/M/1
    assert ttft_miss(mix, 3.0, TTFT) > ttft_miss(same, 3.0, TTFT)


def test_prompts_no_worker_serves_in_time_are_allowed_on_top() -> None:
    # 3% of prompts take longer than the target alone: more than the 1.5% allowed, and no
    # pool size helps them, so they do not make the rest unservable
    times = np.array([0.1] * 97 + [2.5] * 3)
    assert ttft_miss(times, 0.0, TTFT) == pytest.approx(0.03)
    assert 0 < mg1_rate(times, TTFT, ALLOWED) < 1 / times.mean()
    assert ttft_miss(times, mg1_rate(times, TTFT, ALLOWED), TTFT) <= 0.03 + ALLOWED + 1e-9


def test_miss_share_rises_with_the_rate() -> None:
    times = exponential(0.2, 500)
    shares = [ttft_miss(times, r, TTFT) for r in (0.5, 1.0, 2.0, 3.0, 4.0, 4.9)]
    assert shares == sorted(shares) and shares[-1] < 1.0
    assert ttft_miss(times, 1 / times.mean(), TTFT) == 1.0  # overloaded
