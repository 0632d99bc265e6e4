"""How many workers a prefill queue needs for a TTFT target, from the recent requests' prefill
times and arrival times (pure functions; the SLA policy's TTFT side when the connector reports
requests one by one).

The mean-length model (``CapabilityProfile.prefill_rate``) treats each worker as its own M/M/1
queue with the mean prompt. Two things it cannot see decide a fleet's size on a conversation
trace: prompts are heavy-tailed (squared coefficient of variation of prefill time ``cs2`` about
1.5 on the Mooncake trace, 1 for an exponential) and arrivals come in bursts (``ca2`` 8-10 for
the trace's inter-arrival gaps, 1 for Poisson); and a pool is not ``n`` separate queues, the
router sends each request where it starts soonest, so the pool pools. So the pool is taken as
one G/G/c queue with Kingman's (Allen-Cunneen's) approximation: the wait is the M/M/c one
stretched by ``(ca2 + cs2) / 2``,

    P(W > x) = C(c, a) exp(-(c / E[S] - rate) x * 2 / (ca2 + cs2)),   a = rate E[S]

(``C`` Erlang's C, the chance to wait at all). A request's first token comes after its wait
and its own prefill ``s``, so the share missing the target is the mean over the sample of
``s >= TTFT ? 1 : P(W > TTFT - s)``. One worker with Poisson arrivals is the M/G/1 queue in
heavy traffic, and with exponential prefill times too the M/M/1 line exactly. Prompts that take
longer than the target alone miss on any pool; they are allowed on top of the target's
``1 - attainment``. A bursty trough then needs several workers for a few requests a second
(a burst of long prompts must not queue behind each other), and a busy pool fewer per request
than ``n`` separate queues: the two ends where the mean-length model erred in opposite ways.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

STATIONARY_S = 60.0
"""Inter-arrival gaps are compared with their own stretch of this many seconds (a day's rise or
fall is not burstiness)."""


TINY = 1e-12
"""A miss share this small counts as none (the interpolation's floor)."""


@dataclass(frozen=True)
class PrefillSample:
    """The recent requests as the queue needs them."""

    times: np.ndarray
    """Prefill seconds, one per request (``CapabilityProfile.prefill_s`` of its uncached prompt)."""
    ca2: float
    """Squared coefficient of variation of the inter-arrival gaps (1: Poisson)."""

    @classmethod
    def of(cls, arrivals: Sequence[float], times: Sequence[float]) -> PrefillSample:
        """From arrival times (sorted) and prefill times, one each."""
        return cls(np.asarray(times, dtype=float), arrival_ca2(arrivals))

    @property
    def mean(self) -> float:
        return float(self.times.mean())

    @property
    def cs2(self) -> float:
        m = self.mean
        return float(self.times.var()) / (m * m) if m > 0 else 0.0


def arrival_ca2(arrivals: Sequence[float]) -> float:
    """Squared coefficient of variation of the gaps between ``arrivals`` (sorted), each gap
    against the mean gap of its ``STATIONARY_S`` stretch; 1 with too few."""
    if len(arrivals) < 3:
        return 1.0
    at = np.asarray(arrivals, dtype=float)
    gaps = np.diff(at)
    stretch = ((at[1:] - at[0]) // STATIONARY_S).astype(int)
    num = den = 0.0
    for k in np.unique(stretch):
        g = gaps[stretch == k]
        m = float(g.mean())
        if len(g) >= 2 and m > 0:
            num += float(((g - m) ** 2).sum()) / (m * m)
            den += len(g)
    return num / den if den else 1.0


def erlang_c(c: int, a: float) -> float:
    """Chance that a request waits in an M/M/c queue offered ``a`` erlangs (1 when overloaded)."""
    if a >= c:
        return 1.0
    if a <= 0:
        return 0.0
    b = 1.0
    for k in range(1, c + 1):  # Erlang's B by its recurrence (stable for any c)
        b = a * b / (k + a * b)
    return c * b / (c - a * (1.0 - b))


def ttft_miss(sample: PrefillSample, rate: float, workers: int, ttft_s: float) -> float:
    """Share of requests like ``sample`` missing ``ttft_s`` on ``workers`` pooled workers at
    ``rate`` requests/s (module docstring; 1 when overloaded)."""
    s, m = sample.times, sample.mean
    late = s >= ttft_s
    if workers < 1:
        return 1.0
    a = rate * m
    if a >= workers:
        return 1.0
    if a <= 0:
        return float(late.mean())
    decay = (workers / m - rate) * 2.0 / max(sample.ca2 + sample.cs2, 1e-9)
    waits = erlang_c(workers, a) * np.exp(-decay * np.maximum(ttft_s - s, 0.0))
    return float(np.where(late, 1.0, waits).mean())


def workers_for_ttft(
    sample: PrefillSample, rate: float, ttft_s: float, allowed: float, most: int = 4096
) -> float:
    """Workers needed so that at most ``allowed`` more than the prompts no pool serves in time
    miss ``ttft_s``: the smallest whole number, less the part of the last worker not needed
    (linear in the log of the miss share between it and one fewer, an overloaded pool
    missing all), so that the need moves smoothly with the rate; ``inf`` past ``most``."""
    if rate <= 0 or not len(sample.times):
        return 0.0
    budget = float((sample.times >= ttft_s).mean()) + allowed
    load = rate * sample.mean
    lo = max(1, math.floor(load))  # fewer cannot keep up
    prev = ttft_miss(sample, rate, lo - 1, ttft_s)
    for c in range(lo, most + 1):
        miss = ttft_miss(sample, rate, c, ttft_s)
        if miss <= budget:
            miss = max(miss, TINY)
            return c - 1 + math.log(prev / budget) / math.log(prev / miss)
        prev = miss
    return math.inf
