"""The live connector: every ``interval_s`` observe the fleet and its load, decide, act.

Membership (which workers exist, which are starting or draining) comes from the ``Fleet``;
load from a ``LoadView`` (the router service's view of each worker's last load report and the
router's own counters: read-only). The loop holds no policy: it builds an ``Observation``,
calls ``Planner.decide`` and carries each action out through the fleet. ``status()`` is what
``interlock planner status`` shows.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from interlock.logctx import utc
from interlock.metrics.events import EVENTS
from interlock.planner.core import Planner
from interlock.planner.fleet import Fleet
from interlock.planner.policy import Want
from interlock.planner.ramp import routing_weight
from interlock.planner.state import (
    Action,
    AddWorker,
    Arrival,
    Observation,
    RemoveWorker,
    SwitchRole,
    Traffic,
    WorkerView,
)
from interlock.protocol.events import LoadReport
from interlock.protocol.routing import Completion

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TrafficTotals:
    """Running totals since start; the loop turns them into per-interval ``Traffic``."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0


class LoadView(Protocol):
    async def refresh(self) -> None:
        """Bring what the other methods read up to date (once per tick, before them): a view
        over several frontend processes asks the others here."""
        ...

    def report(self, instance_id: str) -> LoadReport | None:
        """The worker's last load report (None: none yet)."""
        ...

    def queued(self) -> int:
        """Requests waiting in the router's admission queue."""
        ...

    def totals(self) -> TrafficTotals: ...

    def completions(self) -> Sequence[Completion]:
        """Requests that finished since the last call (each once)."""
        ...

    def set_weight(self, instance_id: str, weight: float) -> None:
        """The worker's routing weight (``planner.ramp``), in every router that knows it."""
        ...


class PlannerLoop:
    def __init__(
        self, planner: Planner, fleet: Fleet, view: LoadView, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.planner = planner
        self.fleet = fleet
        self.view = view
        self.clock = clock
        self._last: tuple[float, TrafficTotals] | None = None
        self.ticks = 0
        self.errors = 0
        self.replicas: dict[tuple[str, str], int] = {}
        """``(role, "current" | "desired")`` -> workers, as of the last tick."""
        self._ready_since: dict[str, float] = {}

    async def observe(self) -> Observation:
        await self.view.refresh()
        now = self.clock()
        totals = self.view.totals()
        done = self.view.completions()
        traffic = Traffic()
        if self._last is not None:
            t0, old = self._last
            traffic = self.traffic(now - t0, totals.requests - old.requests, totals, old, done)
        self._last = (now, totals)
        views = []
        members = await self.fleet.workers()
        ready = {w.worker_id for w in members if w.ready}
        first = not self._ready_since and self.ticks <= 1
        for wid in ready - set(self._ready_since):
            # Workers ready at the first look are warm already: no ramp for them.
            self._ready_since[wid] = now - (self.planner.config.ramp_s if first else 0.0)
        for wid in set(self._ready_since) - ready:
            del self._ready_since[wid]
        for w in members:
            views.append(
                WorkerView.of(
                    w.worker_id,
                    w.role,
                    self.view.report(w.worker_id) if w.ready else None,
                    ready=w.ready,
                    draining=w.draining,
                    age_s=now - self._ready_since.get(w.worker_id, now),
                )
            )
        cap = await self.fleet.capacity()
        return Observation(
            now,
            tuple(views),
            router_queue=self.view.queued(),
            traffic=traffic,
            room=cap.room,
            room_reason=cap.reason,
            startup_s=Observation.with_returns(cap.startup_s, views),
        )

    def traffic(
        self, dt: float, arrived: int, totals: TrafficTotals, old: TrafficTotals, done: Sequence[Completion]
    ) -> Traffic:
        """One interval's traffic: arrivals from the routers' counters; finished requests,
        whether they met the targets, the tokens they decoded and the requests one by one
        (the tail model's sample, as they finished) from the dispatcher's completions. An
        arrival's output length is known only once it finishes, so the finished requests' mean
        stands in for the arrivals' (``output_tokens``)."""
        c = self.planner.config
        ttft, itl = c.ttft_ms / 1000.0, c.itl_ms / 1000.0
        met = sum(
            1
            for x in done
            if x.ttft_s <= ttft and (x.output_tokens <= 1 or x.decode_s / (x.output_tokens - 1) <= itl)
        )
        osl = sum(x.output_tokens for x in done) / len(done) if done else 0.0
        return Traffic(
            dt,
            arrived,
            totals.prompt_tokens - old.prompt_tokens,
            totals.cached_tokens - old.cached_tokens,
            totals.output_tokens - old.output_tokens or round(osl * arrived),
            finished=len(done),
            met=met,
            decode_tokens=sum(max(x.output_tokens - 1, 0) for x in done),
            decode_s=sum(x.decode_s for x in done if x.output_tokens > 1),
            arrivals=tuple(
                Arrival(x.arrived_s, x.prompt_tokens, x.cached_tokens, x.output_tokens) for x in done
            ),
        )

    async def tick(self) -> list[Action]:
        self.ticks += 1
        obs = await self.observe()
        actions = self.planner.decide(obs)
        self.replicas = _replicas(obs, self.planner.last_wants)
        for a in actions:
            log.info("planner: %s", self.planner.history[-1].line())
            EVENTS.record("planner", type(a).__name__, self.planner.history[-1].line())
            await self.apply(a)
        self._ramp()
        return actions

    def _ramp(self) -> None:
        """Each ready worker younger than the ramp (and one interval more, to land on 1) gets
        its routing weight; age counts from the first observation that saw it ready."""
        c = self.planner.config
        if c.ramp_s <= 0:
            return
        now = self.clock()
        for wid, since in self._ready_since.items():
            if now - since <= c.ramp_s + c.interval_s:
                self.view.set_weight(wid, routing_weight(now - since, c.ramp_s, c.ramp_floor))

    async def apply(self, a: Action) -> None:
        if isinstance(a, AddWorker):
            await self.fleet.add_worker(a.role)
        elif isinstance(a, RemoveWorker):
            await self.fleet.remove_worker(a.worker_id, drain=True)
        elif isinstance(a, SwitchRole):
            await self.fleet.set_role(a.worker_id, a.role)

    async def run(self) -> None:
        """Tick every ``interval_s`` until cancelled; a failing tick is logged and counted."""
        while True:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - one bad tick must not stop the planner
                self.errors += 1
                log.exception("planner tick failed")
            await asyncio.sleep(self.planner.config.interval_s)

    def status(self) -> dict[str, object]:
        p = self.planner
        counts: dict[str, int] = {}
        for r in p.history:
            counts[r.kind] = counts.get(r.kind, 0) + 1
        return {
            "policy": p.config.policy,
            "ticks": self.ticks,
            "errors": self.errors,
            "holding": p.last_hold,
            "wants": [{"role": w.role, "delta": w.delta, "reason": w.reason} for w in p.last_wants],
            "model": p.policy.status(),
            "decisions_total": counts,
            "decisions": [self._stamped(r.to_dict()) for r in p.history],
            "replicas": [
                {"role": role, "state": state, "count": n} for (role, state), n in self.replicas.items()
            ],
        }

    def _stamped(self, d: dict[str, object]) -> dict[str, object]:
        """``d`` with ``time``: when it was decided, wall-clock (ISO 8601, UTC)."""
        at = d["at"]
        assert isinstance(at, float | int)
        stamp = utc(time.time() - (self.clock() - at))
        return {**d, "time": stamp}


def _replicas(obs: Observation, wants: Sequence[Want]) -> dict[tuple[str, str], int]:
    """Workers serving per role (ready, not draining) and what the policy wanted of each."""
    current: dict[str, int] = {}
    for w in obs.workers:
        if w.ready and not w.draining:
            current[w.role] = current.get(w.role, 0) + 1
    desired = dict(current)
    for want in wants:
        desired[want.role] = max(0, desired.get(want.role, 0) + want.delta)
    out = {(r, "current"): n for r, n in sorted(current.items())}
    out.update({(r, "desired"): n for r, n in sorted(desired.items())})
    return out


class FakeLoadView:
    """A ``LoadView`` whose reports, queue and totals a test sets directly; weights set by the
    planner are kept in ``weights``."""

    def __init__(self) -> None:
        self.reports: dict[str, LoadReport] = {}
        self.queue = 0
        self.traffic = TrafficTotals()
        self.done: list[Completion] = []
        """Finished requests the next ``completions`` call hands over."""
        self.weights: dict[str, float] = {}

    async def refresh(self) -> None:
        pass

    def set_weight(self, instance_id: str, weight: float) -> None:
        self.weights[instance_id] = weight

    def report(self, instance_id: str) -> LoadReport | None:
        return self.reports.get(instance_id)

    def queued(self) -> int:
        return self.queue

    def totals(self) -> TrafficTotals:
        return self.traffic

    def completions(self) -> list[Completion]:
        out, self.done = self.done, []
        return out
