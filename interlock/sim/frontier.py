"""What a planner is measured against: the frontier of fixed fleets and the offline bound.

A planner's run is a point (attainment, worker-seconds). The replays of fixed fleets of every
size within the bounds give the frontier it is compared with:

* ``cheapest_reaching``: the smallest fixed fleet whose attainment reaches a target (the fleet
  an operator without a planner would run);
* ``attainment_at``: the attainment of a fixed fleet with given worker-seconds, interpolated
  linearly between the two sizes around it (a planner that does worse than that wasted its
  changes);
* ``offline_bound``: the fewest worker-seconds of a fleet that knows the whole trace, picks one
  of the fixed sizes per bucket of arrivals and changes size instantly and for free, missing at
  most a budget of requests: each bucket's misses at each size come from the fixed replays,
  and a small dynamic programme over (bucket, misses so far) finds it. No planner can beat it
  here (no start-up, no cold cache, perfect foresight), so the gap to it is what is left.

Pure functions of ``ReplayReport``s; the replays themselves are the caller's
(``benchmarks/planner_shapes.py``, ``benchmarks/planner_replay.py``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from interlock.sim.report import ReplayReport


def misses(r: ReplayReport) -> int:
    """Requests that missed the SLA (rejected ones included)."""
    return r.num_requests - round(r.sla_attainment * r.num_requests)


def cheapest_reaching(fixed: Mapping[int, ReplayReport], target: float) -> int | None:
    """The smallest fixed size whose attainment is at least ``target`` (None: none is)."""
    sizes = [n for n, r in fixed.items() if r.sla_attainment >= target]
    return min(sizes) if sizes else None


def attainment_at(fixed: Mapping[int, ReplayReport], worker_seconds: float) -> float:
    """Attainment of a fixed fleet with ``worker_seconds``, interpolated between the sizes
    around it (clamped to the smallest and largest run)."""
    pts = sorted((r.worker_seconds, r.sla_attainment) for r in fixed.values())
    if not pts:
        return math.nan
    if worker_seconds <= pts[0][0]:
        return pts[0][1]
    for (w0, a0), (w1, a1) in zip(pts, pts[1:], strict=False):
        if worker_seconds <= w1:
            return a0 + (a1 - a0) * (worker_seconds - w0) / (w1 - w0) if w1 > w0 else a1
    return pts[-1][1]


def offline_bound(
    fixed: Mapping[int, ReplayReport], span_s: float, bucket_s: float, budget: int
) -> tuple[float, list[int]]:
    """Fewest worker-seconds of a fleet that picks one of the fixed sizes per bucket (free,
    instant changes) and misses at most ``budget`` requests, with the size per bucket
    (``nan`` and no sizes: no choice stays within the budget)."""
    nb = int(span_s // bucket_s) + 1
    per: dict[int, list[int]] = {}
    for n, r in fixed.items():
        counts = [0] * nb
        for t in r.missed_arrivals_s:
            counts[min(int(t // bucket_s), nb - 1)] += 1
        counts[-1] += r.num_rejected
        per[n] = counts
    best = {0: 0}  # misses so far -> fewest workers summed over the buckets so far
    back: list[dict[int, tuple[int, int]]] = []  # per bucket: misses -> (misses before, size)
    for b in range(nb):
        nxt: dict[int, int] = {}
        came: dict[int, tuple[int, int]] = {}
        for m, cost in best.items():
            for n, counts in per.items():
                mm = m + counts[b]
                if mm <= budget and cost + n < nxt.get(mm, 1 << 30):
                    nxt[mm], came[mm] = cost + n, (m, n)
        best = nxt
        back.append(came)
    if not best:
        return math.nan, []
    m = min(best, key=lambda k: best[k])
    cost, sizes = best[m], []
    for came in reversed(back):
        m, n = came[m]
        sizes.append(n)
    return cost * bucket_s, sizes[::-1]
