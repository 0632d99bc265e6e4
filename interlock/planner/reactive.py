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

Steps that fit the backlog: one worker per window is far too slow when the queue is many times
the threshold (a tripled load left 150-180 requests queued per worker for minutes while the
pool grew by one a window). When the queue or the prefill backlog is at least ``FAR`` times its
threshold and no worker is still starting, the pool asks for the workers the backlog needs at
once (``Want.surge``: the core adds them past its holds, within the bounds, the change cap and
the hosts' room): over the window, requests arrived at ``lambda``, and while it was saturated (queue or backlog over
its threshold: a pool with spare capacity finishes what arrives, which says nothing of what it
could) it finished ``F`` requests in ``W`` worker-seconds (ready workers over time: those that
joined late count only since), so a worker serves ``mu = F / W``. The workers asked for now
serve ``startup_s`` later: by then the ``n`` serving ones have taken ``n mu startup_s`` off
the ``Q`` queued while ``lambda startup_s`` more arrived, ``lambda`` being the arrivals of the
last ``RECENT_S`` (the window's mean lags a step up and, after a spike, still counts the spike:
a 60 s spike's window asked for 7 more workers 5 s after it ended, to serve a queue the pool
had cleared before they started). Clearing what is left then, ``Q'``, within one window
needs ``(lambda + Q' / window_s) / mu`` workers. (Nothing finished, or a
connector that does not see finishes: one step, the ordinary path.) One such step at most
doubles the ready pool: the service rate read in the first seconds of a saturation is low (the
requests finishing then started before it), and the next step, once the added workers serve,
measures again. Starting workers count towards the pool, so the same backlog is not asked for twice.

Removal also needs the pool's prefill capacity not too busy once the worker goes: the
arrivals' uncached prompt tokens over the workers' measured prefill speed (``prefill_busy``),
at most ``BUSY_LOW`` of the smaller pool. Queues stay empty on a pool at 55% until one worker
fewer puts it at 110%.

Removal needs the observed figures inside the targets too: when requests finished over the
window, at least ``attainment`` of them met the TTFT and ITL targets; signals low while the
requests miss (heavy prompts, a tail the means do not show) keep the pool.

A removal the pool had to turn back from (it grew again within ``TURN_WINDOWS`` windows with
arrivals per worker not risen: the smaller pool could not hold that load) is not made again
for half an hour at that load per worker (``planner.turns``): a workload whose misses appear
only one worker under the right size otherwise loses a window's requests every few minutes.

Start-up cost (``Observation.startup_s``, measured): add earlier, remove later. A rising queue
or backlog (the window's second half above its first) is projected ``startup_s`` ahead and
grows the pool when the projection crosses the threshold (a worker asked for now serves only
then); a removal waits for the signals to stay low ``startup_s`` longer than the window (a
worker removed too early takes that long to come back).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from interlock.planner.config import PlannerConfig
from interlock.planner.forecast import SHIFT_S
from interlock.planner.policy import Want
from interlock.planner.state import Observation, Traffic, WorkerView
from interlock.planner.turns import TurnMemory

DEFAULT_PREFILL_TPS = 10_000.0
"""Prefill speed assumed for a worker that has not measured one yet."""

FAR = 3.0
"""A queue or backlog this many times its threshold asks for the workers it needs at once."""

TURN_WINDOWS = 5
"""A growth this many windows after a removal, arrivals per worker not having risen, refutes it
(``planner.turns``, as the SLA policy's)."""

BUSY_LOW = 0.6
"""A removal must leave the pool's prefill at most this busy (``prefill_busy``): past it, the
arrivals' bursts queue and a heavy-prompt workload's TTFT tail grows fast."""

MIN_BUSY = 2
"""Fewest saturated observations in the window to read a worker's service rate from."""

RECENT_S = SHIFT_S
"""A backlog-sized step reads the arrival rate over the last this many seconds (the SLA
forecaster's recent rate: one definition of "recent")."""


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


def prefill_busy(workers: list[WorkerView], t: Traffic) -> float:
    """Share of ``workers``' prefill capacity (their measured prefill speeds) that the uncached
    prompt tokens arriving over ``t`` take: a pool whose queues are empty can still be busy
    enough that one worker fewer collapses (a steady load at 55% of two workers is 110% of
    one), and only this signal sees that."""
    if t.duration_s <= 0 or not workers:
        return 0.0
    capacity = sum(w.prefill_tokens_per_s or DEFAULT_PREFILL_TPS for w in workers)
    return max(t.prompt_tokens - t.cached_tokens, 0) / t.duration_s / capacity


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
    duration_s: float = 0.0
    """The traffic of the interval before this sample (the pool requests enter first)."""
    arrived: int = 0
    finished: int = 0
    met: int = 0
    prefill_busy: float = 0.0
    """Share of the ready workers' prefill capacity the arrivals' uncached prompt tokens took
    over the interval before this sample (0: not seen)."""


@dataclass(frozen=True, slots=True)
class Means:
    """A pool's signals averaged over the window."""

    queue: float
    backlog: float
    kv: float
    itl: float | None
    """Seconds between tokens (None: nothing decoded in the window)."""
    met: float | None = None
    """Share of the requests finished over the window that met the targets (None: none)."""
    rising: float = 0.0
    """Pressure (of queue or backlog, whichever larger) projected ``startup_s`` ahead on the
    window's trend (0: not rising)."""
    busy: float = 0.0
    """Mean share of the pool's prefill capacity the arrivals took (``Sample.prefill_busy``)."""

    @classmethod
    def of(cls, seen: deque[Sample], config: PlannerConfig, startup_s: float = 0.0) -> Means:
        k = len(seen)
        steps = [s.step for s in seen if s.step is not None]
        tokens = sum(s.decode_tokens for s in seen)
        itl = [sum(steps) / len(steps)] if steps else []
        if tokens:
            itl.append(sum(s.decode_s for s in seen) / tokens)
        finished = sum(s.finished for s in seen)
        queue = sum(s.queue for s in seen) / k
        backlog = sum(s.backlog for s in seen) / k
        return cls(
            queue,
            backlog,
            sum(s.kv for s in seen) / k,
            max(itl) if itl else None,
            sum(s.met for s in seen) / finished if finished else None,
            _projected(seen, config, startup_s),
            sum(s.prefill_busy for s in seen) / k,
        )


def _spare(m: Means, n: int, c: PlannerConfig) -> int:
    """Workers the pool of ``n`` can lose with its queue, backlog, KV usage and prefill busy
    share still in the low band once their share is spread over the rest (at least one: the
    caller checked one); the core moves at most ``step_share`` of the pool per step."""
    k = n - 1
    lows = ((m.queue, c.queue_low), (m.backlog, c.backlog_low_s), (m.kv, c.kv_low), (m.busy, BUSY_LOW))
    for value, low in lows:
        if value > 0 and low > 0:
            k = min(k, math.floor(n * (1 - value / low)))
    return max(1, k)


def recent_rate(seen: deque[Sample], window_s: float) -> float:
    """Arrivals per second over the newest samples that span ``RECENT_S`` (all of them when
    the window is shorter)."""
    arrived, span = 0, 0.0
    for s in reversed(seen):
        arrived += s.arrived
        span += s.duration_s
        if span >= RECENT_S:
            break
    return arrived / (span or window_s)


def _draining(seen: deque[Sample], c: PlannerConfig, startup_s: float) -> str:
    """Why the window's queue pressure is behind the pool ("" when it is not): the pool's queue
    and backlog now, moving at their pace over the last ``RECENT_S``, will both be under their
    thresholds by the time a worker asked for now would serve (``startup_s``). After a spike
    the window's mean stays over the threshold for a window while the pool is already clearing
    the queue, and a worker added for it serves an empty one (a queue rising towards its
    threshold is ``_projected``'s case, and the caller asks this only when that is not over)."""
    last = seen[-1]
    first = next((s for s in seen if s.at >= last.at - RECENT_S), last)
    dt = last.at - first.at
    if dt <= 0:
        return ""
    ahead = max(startup_s, c.interval_s)
    n = last.size
    for now, then, high in (
        (last.queue, first.queue, c.queue_high),
        (last.backlog, first.backlog, c.backlog_high_s),
    ):
        # the pool's totals: a worker that joined in between changes the per-worker figure
        slope = (now * n - then * first.size) / dt
        if now * n + slope * ahead > high * n:
            return ""
    return (
        f"the queue is draining ({first.queue * first.size:.0f} -> {last.queue * n:.0f} queued in "
        f"{dt:.0f}s: under the threshold before a worker started now would serve)"
    )


def _projected(seen: deque[Sample], c: PlannerConfig, startup_s: float) -> float:
    """The larger of queue and backlog pressure projected ``startup_s`` ahead on the window's
    trend: the second half's mean plus the rise from the first half's, per half-window."""
    k = len(seen)
    if startup_s <= 0 or k < 4 or seen[-1].at - seen[0].at < c.window_s - c.interval_s:
        return 0.0  # a trend needs a whole window: bursts make any half-minute look like one
    first, second = list(seen)[: k // 2], list(seen)[k // 2 :]
    span = (second[-1].at - first[0].at) / 2 or 1.0
    out = 0.0
    for get, high in ((lambda s: s.queue, c.queue_high), (lambda s: s.backlog, c.backlog_high_s)):
        a = sum(map(get, first)) / len(first)
        b = sum(map(get, second)) / len(second)
        if b > a and b > high / 2:  # rising, and already half-way to the threshold
            out = max(out, (b + (b - a) * startup_s / span) / high)
    return out


class ReactivePolicy:
    def __init__(self, config: PlannerConfig) -> None:
        self.config = config
        self._seen: dict[str, deque[Sample]] = {}
        """role -> its samples over the last window."""
        self._low_since: dict[str, float] = {}
        """role -> since when its signals have been low (for a removal's wait)."""
        self.last_means: dict[str, Means] = {}
        """role -> its window's means at the last observation (for status)."""
        self.turns = TurnMemory(TURN_WINDOWS * config.window_s)
        """Removals the pool had to turn back from, as workers per request/s of arrivals."""
        self._rate: float | None = None
        """Arrivals per second, smoothed over about a window (the turn memory's load)."""

    def wants(self, obs: Observation, pools: dict[str, list[WorkerView]]) -> list[Want]:
        c = self.config
        out: list[Want] = []
        entry, decoding = entry_role(pools), decode_role(pools)
        tr = obs.traffic
        if tr.duration_s > 0:
            a = 1.0 - math.exp(-tr.duration_s / c.window_s)
            rate = tr.requests / tr.duration_s
            self._rate = rate if self._rate is None else self._rate + a * (rate - self._rate)
        if self._rate:
            self.turns.observe(
                obs.now, {r: len(ws) for r, ws in pools.items()}, dict.fromkeys(pools, self._rate)
            )
        for role, workers in pools.items():
            ready = [w for w in workers if w.ready]
            if not ready:
                self._low_since.pop(role, None)
                continue
            sig = pool_signals(ready, obs.router_queue if role == entry else 0)
            t: Traffic = obs.traffic if role == decoding else Traffic()
            e: Traffic = obs.traffic if role == entry else Traffic()
            step = decode_step(ready) if role in ("both", "decode") else None
            seen = self._seen.setdefault(role, deque())
            idle = any(w.in_flight == 0 for w in ready)
            seen.append(
                Sample(
                    obs.now,
                    len(ready),
                    *sig,
                    step,
                    idle,
                    t.decode_tokens,
                    t.decode_s,
                    e.duration_s,
                    e.requests,
                    t.finished,
                    t.met,
                    prefill_busy(ready, e),
                )
            )
            while seen[0].at < obs.now - c.window_s:
                seen.popleft()
            want = self._want(role, seen, len(workers), obs.startup_s)
            if want is not None:
                out.append(want)
        return out

    def status(self) -> dict[str, object]:
        """Each pool's window means, for ``interlock planner status``."""
        return {
            "means": {
                r: {
                    "queue": round(m.queue, 3),
                    "backlog_s": round(m.backlog, 3),
                    "kv": round(m.kv, 3),
                    **({"itl_ms": round(1000 * m.itl, 1)} if m.itl is not None else {}),
                    **({"met": round(m.met, 4)} if m.met is not None else {}),
                }
                for r, m in self.last_means.items()
            }
        }

    def _want(self, role: str, seen: deque[Sample], pool: int, startup_s: float) -> Want | None:
        """``pool``: its workers, starting ones included (``seen`` counts the ready ones)."""
        c = self.config
        m = Means.of(seen, c, startup_s)
        self.last_means[role] = m
        itl_target = c.itl_ms / 1000.0
        over = [
            (m.queue / c.queue_high, f"queue {m.queue:.2f}/worker > {c.queue_high:g}"),
            (m.backlog / c.backlog_high_s, f"prefill backlog {m.backlog:.2f}s > {c.backlog_high_s:g}s"),
            (m.kv / c.kv_high, f"kv usage {m.kv:.2f} > {c.kv_high:g}"),
        ]
        decode_over = 0.0
        if m.itl is not None and not seen[-1].idle:
            decode_over = m.itl / itl_target
            over.append((decode_over, f"inter-token time {1000 * m.itl:.0f}ms > {c.itl_ms:g}ms"))
        if m.rising > 1.0:
            over.append(
                (m.rising, f"queue rising: {m.rising:.1f}x its threshold in {startup_s:.0f}s (start-up)")
            )
        pressure, why = max(over)
        span = f" (mean over {seen[-1].at - seen[0].at:.0f}s)"
        if pressure > 1.0:
            self._low_since.pop(role, None)
            far = self._backlog_want(role, seen, m, pool, startup_s)
            if far is not None:
                return far
            queued_only = max(m.kv / c.kv_high, decode_over, m.rising) <= 1.0
            if queued_only and (drained := _draining(seen, c, startup_s)):
                return Want(role, 0, 0.0, f"{why}{span}, but {drained}: no add")
            return Want(role, +1, pressure, why + span)
        n = seen[-1].size
        full = seen[-1].at - seen[0].at >= c.window_s - c.interval_s
        if not full or any(s.size != n for s in seen):
            return None  # not a whole window at this size yet (a low spell before it still counts)
        share = n / (n - 1) if n > 1 else 1.0
        itl_ok = m.itl is None or m.itl <= c.itl_low * itl_target
        low = (
            m.queue * share <= c.queue_low
            and m.backlog * share <= c.backlog_low_s
            and m.kv * share < c.kv_low
            and m.busy * share <= BUSY_LOW
            and itl_ok
        )
        if not low:
            self._low_since.pop(role, None)
            return None
        if m.met is not None and m.met < c.attainment:
            self._low_since.pop(role, None)
            return Want(
                role,
                0,
                0.0,
                f"removal refused: {100 * m.met:.1f}% of the requests finished over "
                f"{c.window_s:g}s met the targets < {100 * c.attainment:g}%",
            )
        since = self._low_since.setdefault(role, seen[-1].at)
        if seen[-1].at - since < startup_s:
            return Want(
                role,
                0,
                0.0,
                f"low for {seen[-1].at - since:.0f}s of the {startup_s:.0f}s a new worker takes "
                "to start: removal waits",
            )
        itl = (
            "" if m.itl is None else f", inter-token time {1000 * m.itl:.0f}ms <= {c.itl_low * c.itl_ms:g}ms"
        )
        met = "" if m.met is None else f", {100 * m.met:.1f}% met the targets"
        spare = _spare(m, n, c)
        fewest = self.turns.fewest(role, self._rate or 0.0)
        if n - spare < fewest:
            spare = n - fewest
            met += f", not under {fewest}: a removal to that load per worker was turned back"
            if spare < 1:
                return Want(role, 0, 0.0, "removal held" + met)
        return Want(
            role,
            -spare,
            1.0 - m.kv,
            f"over {c.window_s:g}s queue {m.queue:.2f}/worker <= {c.queue_low:g}, "
            f"prefill backlog {m.backlog:.2f}s <= {c.backlog_low_s:g}s, kv usage "
            f"{m.kv:.2f} < {c.kv_low:g}{itl}{met}",
        )

    def _backlog_want(
        self, role: str, seen: deque[Sample], m: Means, pool: int, startup_s: float
    ) -> Want | None:
        """The workers a backlog far past its threshold needs, at once (module docstring);
        None: not far past, or a worker is still starting (its effect is not seen yet)."""
        c = self.config
        far = max(m.queue / c.queue_high, m.backlog / c.backlog_high_s)
        n = seen[-1].size
        if far < FAR or pool > n:
            return None
        arrived = recent_rate(seen, c.window_s)
        busy = [s for s in seen if s.queue >= c.queue_high or s.backlog >= c.backlog_high_s]
        finished = sum(s.finished for s in busy)
        worker_s = sum(s.size * s.duration_s for s in busy)  # ready workers, while saturated
        queued = seen[-1].queue * n
        if len(busy) < MIN_BUSY and any(s.finished for s in seen):
            # one more observation gives the service rate: an ordinary step now would hold the
            # sized one back until its worker started
            return Want(role, 0, 0.0, f"queue {m.queue:.1f}/worker: measuring what a busy worker serves")
        if finished <= 0 or worker_s <= 0:
            return None  # no service rate to size from (or the connector does not see finishes)
        per = finished / worker_s
        left = max(queued + (arrived - per * n) * startup_s, 0.0)
        need = (arrived + left / c.window_s) / per
        how = (
            f"{arrived:.2f} req/s arriving, {per:.2f} finishing per worker, {queued:.0f} queued "
            f"({left:.0f} in {startup_s:.0f}s): needs {need:.1f}"
        )
        more = min(math.ceil(need) - pool, n)  # at most doubling: the next step measures again
        if more < 2:
            return None
        why = f"queue {m.queue:.1f}/worker, backlog {m.backlog:.1f}s: {how} workers"
        if more < math.ceil(need) - pool:
            why += f", doubling the {n} first"
        return Want(role, more, far, why, surge=True)
