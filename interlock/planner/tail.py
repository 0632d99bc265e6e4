"""Tail-aware capacity: the share of recent requests that would miss the targets on ``n``
workers (pure functions).

Means hide what makes requests miss at moderate load: requests come in bursts (a conversation
trace puts several at one instant) and prompts are heavy-tailed (a 100k-token prompt holds a
worker for seconds), and a short answer decoding on a worker busy with such a prompt gets each
token after a whole prefill chunk. A mean-rate model says two workers carry a trough that loses
one request in twelve on them. So the SLA policy replays the requests that arrived recently
against ``n`` candidate workers, each one a first-come-first-served prefill server (the router
sends a request where it starts soonest: least-work-left dispatch, which is one central FCFS
queue), and counts the requests that would miss:

* TTFT: its wait plus its own prefill (each chunk also carries a decode step) is over the target;
* ITL: while it decodes ``osl - 1`` tokens its worker spends ``P`` seconds on other prompts'
  chunks; every such step gives it a token late, so its mean inter-token time is
  ``d + P / (osl - 1)`` (at most one chunk step per token): over the target, it misses.

The arrival times are divided by ``scale`` (the forecast's rate over the sample's: the same
requests, denser), bursts kept whole. ``workers_needed`` is the smallest ``n`` whose predicted
miss share is within what is allowed.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Job:
    """One request as the replay needs it."""

    at: float
    """Arrival (seconds, any origin)."""
    prefill_s: float
    """Its uncached prompt's prefill time on an idle worker (``CapabilityProfile.prefill_s``)."""
    chunks: int
    """Steps its prefill takes (each also carries the worker's decode step)."""
    output_tokens: int


@dataclass(frozen=True, slots=True)
class StepTimes:
    decode_s: float
    """A decode step at the worker's usual batch (what a token costs with no prefill)."""
    chunk_s: float
    """A full prefill chunk (the longest a token can wait for one step)."""


def miss_share(
    jobs: Sequence[Job], n: int, steps: StepTimes, ttft_s: float, itl_s: float, scale: float = 1.0
) -> float:
    """Share of ``jobs`` (sorted by arrival) missing the TTFT or the ITL target on ``n`` workers."""
    if not jobs:
        return 0.0
    if n < 1:
        return 1.0
    d = steps.decode_s
    free = [(0.0, j) for j in range(n)]
    t0 = jobs[0].at
    starts: list[list[float]] = [[] for _ in range(n)]
    ends: list[list[float]] = [[] for _ in range(n)]
    placed: list[tuple[int, int]] = []
    missed = 0
    for job in jobs:
        at = (job.at - t0) / scale
        free_at, j = heapq.heappop(free)
        start = max(at, free_at)
        end = start + job.prefill_s + job.chunks * d
        heapq.heappush(free, (end, j))
        starts[j].append(start)
        ends[j].append(end)
        placed.append((j, len(ends[j]) - 1))
        if end - at > ttft_s:
            missed += 1
            placed[-1] = (-1, 0)
    for job, (j, k) in zip(jobs, placed, strict=True):
        if j < 0 or job.output_tokens <= 1:
            continue
        tokens = job.output_tokens - 1
        first = ends[j][k]
        busy = _busy(starts[j], ends[j], k + 1, first, first + tokens * d)
        if min(d + busy / tokens, d + steps.chunk_s) > itl_s:
            missed += 1
    return missed / len(jobs)


def _busy(starts: list[float], ends: list[float], k: int, t: float, until: float) -> float:
    """Prefill seconds the worker spends from ``t`` on while a request that needs ``until - t``
    seconds of plain decoding is still decoding (each busy second pushes its end a second)."""
    busy = 0.0
    i = max(k, bisect_right(ends, t))
    while i < len(starts) and starts[i] < until + busy:
        s, e = max(starts[i], t), ends[i]
        busy += e - s
        i += 1
    return busy


def workers_needed(
    jobs: Sequence[Job],
    steps: StepTimes,
    ttft_s: float,
    itl_s: float,
    allowed: float,
    *,
    scale: float = 1.0,
    most: int = 64,
) -> int:
    """Smallest ``n`` in ``1..most`` whose predicted miss share is at most ``allowed`` (``most``
    if none is): the share falls as ``n`` grows, so a bisection finds it."""
    lo, hi = 1, most
    while lo < hi:
        mid = (lo + hi) // 2
        if miss_share(jobs, mid, steps, ttft_s, itl_s, scale) <= allowed:
            hi = mid
        else:
            lo = mid + 1
    return lo
