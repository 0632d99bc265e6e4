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
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from interlock.errors import ConfigError
from interlock.planner import (
    AddWorker,
    Arrival,
    CapabilityProfile,
    Observation,
    PlannerConfig,
    RemoveWorker,
    Traffic,
    WorkerView,
    build_planner,
    routing_weight,
)

if TYPE_CHECKING:
    from interlock.sim.replay import _Driver

UNWEIGHTED_POLICIES = ("round-robin", "random")


class PlannerConnector:
    def __init__(
        self, drv: _Driver, config: PlannerConfig, profile: CapabilityProfile | None, router_policy: str
    ) -> None:
        if config.prefill.max or config.decode.max:
            raise ConfigError(
                "the replay simulates aggregated workers: planner prefill and decode bounds must be 0"
            )
        if config.ramp_s > 0 and router_policy in UNWEIGHTED_POLICIES:
            raise ConfigError(
                f"router policy {router_policy!r} has no routing weights: "
                "a planner ramp needs kv, least-loaded or power-of-two (or ramp_s 0)"
            )
        if config.policy == "sla" and profile is None:
            raise ConfigError("the sla planner needs a capability profile (interlock profile)")
        self.drv = drv
        self.config = config
        self.planner = build_planner(config, profile)
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
        return Observation(now, tuple(views), router_queue=len(drv.router.queue), traffic=traffic)

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
