"""The planner's virtual-time connector: observes the replay's workers every ``interval_s`` of
virtual time and carries the planner's actions out on the simulated fleet.

* observe: each worker's last load (running, waiting, queued prefill, KV usage), whether it is
  still starting or draining, its age, the router's admission queue, the requests that arrived
  since the last tick (with the router's predicted cached tokens) and those that finished (and
  how many met the planner's TTFT and ITL targets; TTFT from the request's arrival at the
  router) and the tokens decoded with their inter-token times as the traffic, the arrivals one
  by one for the SLA policy's tail model;
  cached blocks only one worker holds come from the router's index, counted only when the
  planner may act (counting walks the whole index);
* add: a worker starts now and joins the router ``startup_s`` later;
* remove: the router stops sending to it; it stops when its last request finishes;
* ramp: every tick each worker younger than ``ramp_s`` gets its routing weight
  (``planner.ramp``), so a cold worker is not flooded.

The replay simulates aggregated workers only, so the planner's prefill and decode bounds must
be 0 here.

``FleetSchedule`` stands in for the planner where a bound needs a fleet that follows a given
size over time (``ReplayConfig.fleet_schedule``): at each tick it adds or removes as many
workers as the schedule's size at that moment says, with no window, cap or forecast. A worker
it adds still starts ``startup_s`` late, so a schedule that changes exactly when the load does
is a *causal* bound: a planner that knows the fleet each moment needs, but only from that
moment on.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from functools import partial
from typing import Protocol

from interlock.errors import ConfigError
from interlock.names import UNWEIGHTED_POLICIES
from interlock.planner import (
    Action,
    AddWorker,
    Arrival,
    CapabilityProfile,
    DecisionRecord,
    Observation,
    PlannerConfig,
    RemoveWorker,
    Traffic,
    WorkerView,
    build_planner,
    routing_weight,
)
from interlock.planner.select import cheapest
from interlock.protocol.events import LoadReport
from interlock.router import Router
from interlock.sim.trace import SimRequest
from interlock.sim.worker import SimSeq


class _Reporting(Protocol):
    def load_report(self, now: float) -> LoadReport: ...


class _Startup(Protocol):
    @property
    def startup_s(self) -> float: ...


class SimFleet(Protocol):
    """What the connector reads and drives of the replay (``sim.replay._Driver``)."""

    @property
    def now(self) -> float: ...

    @property
    def cfg(self) -> _Startup: ...

    @property
    def router(self) -> Router: ...

    @property
    def workers(self) -> Mapping[str, _Reporting]: ...

    @property
    def ready(self) -> Mapping[str, float]: ...

    @property
    def draining(self) -> AbstractSet[str]: ...

    @property
    def done(self) -> Sequence[SimSeq]: ...

    @property
    def itl_s(self) -> Sequence[float]: ...

    @property
    def itl_w(self) -> Sequence[int]: ...

    def start_worker(self) -> str: ...

    def join(self, wid: str) -> None: ...

    def drain(self, wid: str) -> None: ...

    def call_at(self, t: float, fn: Callable[[], None]) -> None: ...

    def take_arrivals(self) -> list[tuple[SimRequest, int]]: ...


class Decider(Protocol):
    """What the connector drives: the planner, or a ``FleetSchedule``."""

    history: list[DecisionRecord]

    def decide(self, obs: Observation) -> list[Action]: ...

    def holding(self, now: float) -> bool: ...


class FleetSchedule:
    """A fleet of the scheduled size at every moment (module docstring): ``(from_s, size)``
    pieces in time order, the first from 0."""

    def __init__(self, schedule: Sequence[tuple[float, int]], cache_block_cost: float = 1.0 / 64) -> None:
        times = [t for t, _ in schedule]
        if not schedule or times[0] != 0 or times != sorted(times) or any(n < 1 for _, n in schedule):
            raise ConfigError("a fleet schedule needs (from_s, size) pieces from 0 on, in order, sizes >= 1")
        self._times = times
        self._sizes = [n for _, n in schedule]
        self.cache_block_cost = cache_block_cost
        self.history: list[DecisionRecord] = []

    def _piece(self, now: float) -> int:
        return bisect.bisect_right(self._times, now) - 1

    def holding(self, now: float) -> bool:
        return False

    def decide(self, obs: Observation) -> list[Action]:
        pool = obs.pool("both")
        i = self._piece(obs.now)
        want = self._sizes[i]
        why = f"scheduled {want} workers from t={self._times[i]:g}s"
        out: list[Action] = [AddWorker("both", why) for _ in range(want - len(pool))]
        for _ in range(len(pool) - want):
            victim = cheapest(pool, self.cache_block_cost)
            pool.remove(victim)
            out.append(RemoveWorker(victim.worker_id, why))
        self.history += [DecisionRecord(obs.now, a) for a in out]
        return out


class PlannerConnector:
    def __init__(
        self,
        drv: SimFleet,
        config: PlannerConfig,
        profile: CapabilityProfile | None,
        router_policy: str,
        schedule: Sequence[tuple[float, int]] = (),
    ) -> None:
        """``schedule``: follow it (``FleetSchedule``) instead of the planner ``config`` builds
        (whose interval, ramp and removal cost still apply)."""
        if config.prefill.max or config.decode.max:
            raise ConfigError(
                "the replay simulates aggregated workers: planner prefill and decode bounds must be 0"
            )
        if config.ramp_s > 0 and router_policy in UNWEIGHTED_POLICIES:
            raise ConfigError(
                f"router policy {router_policy!r} has no routing weights: "
                "a planner ramp needs kv, least-loaded or power-of-two (or ramp_s 0)"
            )
        if config.policy == "sla" and profile is None and not schedule:
            raise ConfigError("the sla planner needs a capability profile (interlock profile)")
        self.drv = drv
        self.config = config
        self.planner: Decider = (
            FleetSchedule(schedule, config.cache_block_cost) if schedule else build_planner(config, profile)
        )
        self._last_tick = 0.0
        self._done_seen = 0
        self._itl_seen = 0
        drv.call_at(0.0, self.tick)

    def _finished(self) -> tuple[int, int]:
        """Requests finished since the last tick, and how many met the planner's targets."""
        done = self.drv.done[self._done_seen :]
        self._done_seen = len(self.drv.done)
        ttft, itl = self.config.ttft_ms / 1000.0, self.config.itl_ms / 1000.0
        met = sum(
            1
            for s in done
            if s.first_token_s - s.req.arrival_s <= ttft
            and (
                s.req.output_tokens <= 1 or (s.finish_s - s.first_token_s) / (s.req.output_tokens - 1) <= itl
            )
        )
        return len(done), met

    def _decoded(self) -> tuple[int, float]:
        """Tokens decoded since the last tick and the sum of their inter-token times (each
        step's time once per request it decoded)."""
        steps, tokens = self.drv.itl_s[self._itl_seen :], self.drv.itl_w[self._itl_seen :]
        self._itl_seen = len(self.drv.itl_s)
        return sum(tokens), sum(s * n for s, n in zip(steps, tokens, strict=True))

    def observe(self) -> Observation:
        drv, now = self.drv, self.drv.now
        arrived = drv.take_arrivals()
        finished, met = self._finished()
        decode_tokens, decode_s = self._decoded()
        traffic = Traffic(
            duration_s=now - self._last_tick,
            requests=len(arrived),
            prompt_tokens=sum(r.prompt_tokens for r, _ in arrived),
            cached_tokens=sum(c for _, c in arrived),
            output_tokens=sum(r.output_tokens for r, _ in arrived),
            finished=finished,
            met=met,
            decode_tokens=decode_tokens,
            decode_s=decode_s,
            arrivals=tuple(Arrival(r.arrival_s, r.prompt_tokens, c, r.output_tokens) for r, c in arrived),
        )
        self._last_tick = now
        unique = {} if self.planner.holding(now) else drv.router.indexer.unique_counts()
        views = []
        for wid, w in drv.workers.items():
            joined = drv.ready.get(wid)
            views.append(
                WorkerView.of(
                    wid,
                    "both",
                    w.load_report(now),
                    unique_blocks=unique.get(wid, 0),
                    ready=joined is not None,
                    draining=wid in drv.draining,
                    age_s=now - joined if joined is not None else 0.0,
                )
            )
        return Observation(
            now,
            tuple(views),
            router_queue=len(drv.router.queue),
            traffic=traffic,
            startup_s=drv.cfg.startup_s,
        )

    def tick(self) -> None:
        drv = self.drv
        for action in self.planner.decide(self.observe()):
            if isinstance(action, AddWorker):
                wid = drv.start_worker()
                drv.call_at(drv.now + drv.cfg.startup_s, partial(self._join, wid))
            elif isinstance(action, RemoveWorker):
                drv.drain(action.worker_id)
            else:  # pragma: no cover - aggregated only (checked above)
                raise AssertionError(f"unexpected action {action}")
        self._ramp()
        drv.call_at(drv.now + self.config.interval_s, self.tick)

    def _join(self, wid: str) -> None:
        if wid in self.drv.workers and wid not in self.drv.draining:
            self.drv.join(wid)
            self._ramp()

    def _ramp(self) -> None:
        c, drv = self.config, self.drv
        if c.ramp_s <= 0:
            return
        for wid, joined in drv.ready.items():
            age = drv.now - joined
            if age <= c.ramp_s + c.interval_s:
                drv.router.set_weight(wid, routing_weight(age, c.ramp_s, c.ramp_floor))
