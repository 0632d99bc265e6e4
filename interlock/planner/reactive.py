"""The reactive policy: grow a pool when its work queues, its KV cache fills or its tokens come
too slowly; shrink it when all of that stayed low for a whole window, with a dead band in
between (hysteresis).

Per pool (the workers of one role), at each observation:

* ``queue``: waiting requests per worker (the router's admission queue counts towards the pool
  requests enter first: aggregated, else prefill);
* ``backlog``: seconds of queued prefill per worker (queued prompt tokens over the worker's
  measured prefill speed): a worker that admits everything has no waiting requests, yet a
  request arriving now waits this long for its first token;
* ``kv``: mean KV usage;
* ``itl`` (the pool that decodes: aggregated, else decode): the inter-token time it delivers,
  the larger of its busy workers' mean decode step and the mean inter-token time of the tokens
  it produced (when the connector sees them: a decode step alone misses the prefill chunks
  that share it). A pool can keep its queues empty and its cache half
  free while every request decodes in a batch too large to meet the ITL target; only this
  signal sees that.

A signal over its ``*_high`` threshold (ITL: over ``itl_ms``), on average over the last
``window_s``, grows the pool. The pool shrinks only after a whole window at its current size,
and only if every signal's average would still be at or under its ``*_low`` threshold with this
worker's share spread over the others (``x n / (n - 1)``): after a removal the pool is still in
the low band, not in the dead band next to growing again. ITL is not scaled so: a decode step
has a large fixed part and does not grow in proportion to the batch; its low band
(``itl_low * itl_ms``) is the margin instead. Averages, not maxima: arrivals come in bursts (a
request waits for the next step to be admitted) and a trace with heavy-tailed prompts puts a
100k-token prompt somewhere in every window; either would otherwise pin the fleet at its peak.
A load hovering at either threshold moves the pool one way only; reversing takes a real change
of load across the whole band, held for a window.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from interlock.planner.config import PlannerConfig
from interlock.planner.policy import Want
from interlock.planner.state import Observation, Traffic, WorkerView

DEFAULT_PREFILL_TPS = 10_000.0
"""Prefill speed assumed for a worker that has not measured one yet."""


def entry_role(pools: dict[str, list[WorkerView]]) -> str | None:
    """The pool a new request queues for first."""
    for role in ("both", "prefill", "decode"):
        if pools.get(role):
            return role
    return None


def decode_role(pools: dict[str, list[WorkerView]]) -> str | None:
    """The pool whose workers produce the output tokens."""
    for role in ("both", "decode"):
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


def decode_step(workers: list[WorkerView]) -> float | None:
    """Mean decode step of the workers that are decoding (None: none is, or none measured)."""
    steps = [w.decode_step_s for w in workers if w.num_running and w.decode_step_s > 0]
    return sum(steps) / len(steps) if steps else None


@dataclass(frozen=True, slots=True)
class Sample:
    """One observation of a pool."""

    at: float
    size: int
    queue: float
    backlog: float
    kv: float
    step: float | None = None
    """Mean decode step of its decoding workers (the pool that decodes only)."""
    idle: bool = False
    """A ready worker of the pool had nothing to do."""
    decode_tokens: int = 0
    """Tokens decoded and their inter-token times (``Traffic``), for the pool that decodes."""
    decode_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Means:
    """A pool's signals averaged over the window."""

    queue: float
    backlog: float
    kv: float
    itl: float | None
    """Seconds between tokens (None: nothing decoded in the window)."""

    @classmethod
    def of(cls, seen: deque[Sample]) -> Means:
        k = len(seen)
        steps = [s.step for s in seen if s.step is not None]
        tokens = sum(s.decode_tokens for s in seen)
        itl = [sum(steps) / len(steps)] if steps else []
        if tokens:
            itl.append(sum(s.decode_s for s in seen) / tokens)
        return cls(
            sum(s.queue for s in seen) / k,
            sum(s.backlog for s in seen) / k,
            sum(s.kv for s in seen) / k,
            max(itl) if itl else None,
        )


class ReactivePolicy:
    def __init__(self, config: PlannerConfig) -> None:
        self.config = config
        self._seen: dict[str, deque[Sample]] = {}
        """role -> its samples over the last window."""

    def wants(self, obs: Observation, pools: dict[str, list[WorkerView]]) -> list[Want]:
        c = self.config
        out: list[Want] = []
        entry, decoding = entry_role(pools), decode_role(pools)
        for role, workers in pools.items():
            ready = [w for w in workers if w.ready]
            if not ready:
                continue
            sig = pool_signals(ready, obs.router_queue if role == entry else 0)
            t: Traffic = obs.traffic if role == decoding else Traffic()
            step = decode_step(ready) if role in ("both", "decode") else None
            seen = self._seen.setdefault(role, deque())
            idle = any(w.in_flight == 0 for w in ready)
            seen.append(Sample(obs.now, len(ready), *sig, step, idle, t.decode_tokens, t.decode_s))
            while seen[0].at < obs.now - c.window_s:
                seen.popleft()
            want = self._want(role, seen)
            if want is not None:
                out.append(want)
        return out

    def _want(self, role: str, seen: deque[Sample]) -> Want | None:
        c = self.config
        m = Means.of(seen)
        itl_target = c.itl_ms / 1000.0
        over = [
            (m.queue / c.queue_high, f"queue {m.queue:.2f}/worker > {c.queue_high:g}"),
            (m.backlog / c.backlog_high_s, f"prefill backlog {m.backlog:.2f}s > {c.backlog_high_s:g}s"),
            (m.kv / c.kv_high, f"kv usage {m.kv:.2f} > {c.kv_high:g}"),
        ]
        if m.itl is not None and not seen[-1].idle:
            over.append((m.itl / itl_target, f"inter-token time {1000 * m.itl:.0f}ms > {c.itl_ms:g}ms"))
        pressure, why = max(over)
        if pressure > 1.0:
            return Want(role, +1, pressure, f"{why} (mean over {seen[-1].at - seen[0].at:.0f}s)")
        n = seen[-1].size
        full = seen[-1].at - seen[0].at >= c.window_s - c.interval_s
        if not full or any(s.size != n for s in seen):
            return None  # not a whole window at this size yet
        share = n / (n - 1) if n > 1 else 1.0
        itl_ok = m.itl is None or m.itl <= c.itl_low * itl_target
        if (
            m.queue * share <= c.queue_low
            and m.backlog * share <= c.backlog_low_s
            and m.kv * share < c.kv_low
            and itl_ok
        ):
            itl = (
                ""
                if m.itl is None
                else f", inter-token time {1000 * m.itl:.0f}ms <= {c.itl_low * c.itl_ms:g}ms"
            )
            return Want(
                role,
                -1,
                1.0 - m.kv,
                f"over {c.window_s:g}s queue {m.queue:.2f}/worker <= {c.queue_low:g}, "
                f"prefill backlog {m.backlog:.2f}s <= {c.backlog_low_s:g}s, kv usage "
                f"{m.kv:.2f} < {c.kv_low:g}{itl}",
            )
        return None
