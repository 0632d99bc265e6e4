"""The reactive policy: grow a pool when its work queues or its KV cache fills, shrink it when
all of that stayed low for a whole window, with a dead band in between (hysteresis).

Per pool (the workers of one role), at each observation:

* ``queue``: waiting requests per worker (the router's admission queue counts towards the pool
  requests enter first: aggregated, else prefill);
* ``backlog``: seconds of queued prefill per worker (queued prompt tokens over the worker's
  measured prefill speed): a worker that admits everything has no waiting requests, yet a
  request arriving now waits this long for its first token;
* ``kv``: mean KV usage.

A signal over its ``*_high`` threshold, on average over the last ``window_s``, grows the pool.
The pool shrinks only after a whole window at its current size, and only if every signal's
average would still be at or under its ``*_low`` threshold with this worker's share spread over
the others (``x n / (n - 1)``): after a removal the pool is still in the low band, not in the
dead band next to growing again. Averages, not maxima: arrivals come in bursts (a request
waits for the next step to be admitted) and a trace with heavy-tailed prompts puts a
100k-token prompt somewhere in every window; either would otherwise pin the fleet at its peak. A load hovering at either threshold moves the pool one way only; reversing takes a real
change of load across the whole band, held for a window.
"""

from __future__ import annotations

from collections import deque

from interlock.planner.config import PlannerConfig
from interlock.planner.policy import Want
from interlock.planner.state import Observation, WorkerView

DEFAULT_PREFILL_TPS = 10_000.0
"""Prefill speed assumed for a worker that has not measured one yet."""


def entry_role(pools: dict[str, list[WorkerView]]) -> str | None:
    """The pool a new request queues for first."""
    for role in ("both", "prefill", "decode"):
        if pools.get(role):
            return role
    return None


def pool_signals(workers: list[WorkerView], router_queue: int) -> tuple[float, float, float]:
    """``(queue, backlog_s, kv)`` of ready workers (see module docstring)."""
    n = len(workers)
    queue = (sum(w.num_waiting for w in workers) + router_queue) / n
    backlog = (
        sum(w.queued_prefill_tokens / (w.prefill_tokens_per_s or DEFAULT_PREFILL_TPS) for w in workers) / n
    )
    kv = sum(w.kv_usage for w in workers) / n
    return queue, backlog, kv


class ReactivePolicy:
    def __init__(self, config: PlannerConfig) -> None:
        self.config = config
        self._seen: dict[str, deque[tuple[float, int, float, float, float]]] = {}
        """role -> (time, pool size, queue, backlog, kv) over the last window."""

    def wants(self, obs: Observation, pools: dict[str, list[WorkerView]]) -> list[Want]:
        c = self.config
        out: list[Want] = []
        entry = entry_role(pools)
        for role, workers in pools.items():
            ready = [w for w in workers if w.ready]
            if not ready:
                continue
            sig = pool_signals(ready, obs.router_queue if role == entry else 0)
            seen = self._seen.setdefault(role, deque())
            seen.append((obs.now, len(ready), *sig))
            while seen[0][0] < obs.now - c.window_s:
                seen.popleft()
            want = self._want(role, seen)
            if want is not None:
                out.append(want)
        return out

    def _want(self, role: str, seen: deque[tuple[float, int, float, float, float]]) -> Want | None:
        c = self.config
        k = len(seen)
        queue = sum(s[2] for s in seen) / k
        backlog = sum(s[3] for s in seen) / k
        kv = sum(s[4] for s in seen) / k
        over = [
            (queue / c.queue_high, f"queue {queue:.2f}/worker > {c.queue_high:g}"),
            (backlog / c.backlog_high_s, f"prefill backlog {backlog:.2f}s > {c.backlog_high_s:g}s"),
            (kv / c.kv_high, f"kv usage {kv:.2f} > {c.kv_high:g}"),
        ]
        pressure, why = max(over)
        if pressure > 1.0:
            return Want(role, +1, pressure, f"{why} (mean over {seen[-1][0] - seen[0][0]:.0f}s)")
        n = seen[-1][1]
        full = seen[-1][0] - seen[0][0] >= c.window_s - c.interval_s
        if not full or any(s[1] != n for s in seen):
            return None  # not a whole window at this size yet
        share = n / (n - 1) if n > 1 else 1.0
        if queue * share <= c.queue_low and backlog * share <= c.backlog_low_s and kv * share < c.kv_low:
            return Want(
                role,
                -1,
                1.0 - kv,
                f"over {c.window_s:g}s queue {queue:.2f}/worker <= {c.queue_low:g}, "
                f"prefill backlog {backlog:.2f}s <= {c.backlog_low_s:g}s, kv usage "
                f"{kv:.2f} < {c.kv_low:g}",
            )
        return None
