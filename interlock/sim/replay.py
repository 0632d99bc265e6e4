"""Virtual-time trace replay: N simulated workers behind a real ``Router``.

One event loop over two sources, in time order: request arrivals (routed by the router on the
spot, with the router's clock set to virtual time) and worker step ends. A worker's KV events
and load reports reach the router at the end of each step (no transport delay), its first
tokens and finishes update the router's dispatch accounting, exactly as the async glue does
with real processes. Requests the router queues (every worker busy) are dispatched after each
finish. A request the router refuses (its admission queue full: ``Overloaded``; no worker
could take it: ``NoWorkers``) is counted as rejected, with the reason, as a deployment would
answer 503; a replay past overload finishes and reports them next to the rest.

The fleet may change during a replay (``ReplayConfig.planner``: the planner connector in
``sim.planned`` observes the workers every ``interval_s`` of virtual time): a worker is started
(it costs worker-seconds from then on) and joins the router ``startup_s`` later; a removed
worker drains (the router stops sending to it, as its load reports say ``draining``) and stops
when its last request finishes. Timers are a third event source, in time order with the others.

The report compares the prefix-cache hit ratio with the trace's infinite-cache upper bound and
the pooled-cache bound (one LRU cache as large as all workers together, ``sim.bounds``), and
gives TTFT and ITL percentiles, throughput, per-worker load imbalance, SLA attainment (share of
submitted requests meeting both the TTFT and the ITL target) and worker-seconds.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial

import msgspec
import numpy as np

from interlock.engine.pacing import LOAD_INTERVAL_S
from interlock.engine.timing import TimingModel
from interlock.errors import ConfigError, NoWorkers, Overloaded
from interlock.planner import CapabilityProfile, PlannerConfig
from interlock.protocol.discovery import InstanceInfo
from interlock.protocol.events import KVEventBatch, LoadReport
from interlock.router import Decision, RequestMeta, Router, RouterConfig
from interlock.sim.bounds import cache_bounds
from interlock.sim.engine_worker import EngineWorker
from interlock.sim.planned import PlannerConnector
from interlock.sim.report import ReplayReport, build_report
from interlock.sim.tiers import SimTiers
from interlock.sim.trace import SimRequest
from interlock.sim.worker import MOCKER_MAX_NUM_SEQS, SimSeq, SimWorker, WorkerShape, WorkerSink

Worker = SimWorker | EngineWorker


@dataclass(frozen=True)
class ReplayConfig:
    num_workers: int = 8
    num_blocks: int = 61_000
    """KV blocks per worker."""
    block_size: int = 64
    """Tokens per KV block (the trace's hash block size is set apart, ``TraceHasher``)."""
    max_num_batched_tokens: int = 8192
    """Prompt and decode tokens one engine step may compute."""
    max_num_seqs: int = MOCKER_MAX_NUM_SEQS
    """As Dynamo's mocker, not this project's engine (``sim.worker.MOCKER_MAX_NUM_SEQS``)."""
    engine_speedup: float = 1.0
    """Divides modelled step times (Dynamo's ``--speedup-ratio``); arrival speed-up is applied
    when building the requests."""
    publish_events: bool = True
    """False: workers publish no KV events (the router predicts their caches)."""
    report_interval_s: float = LOAD_INTERVAL_S
    """Each worker's load reports at most this often (virtual seconds), as a deployed worker
    paces them (``engine/pacing.py``); 0: one after every engine step."""
    router: RouterConfig = field(default_factory=RouterConfig)
    queue_depth_threshold: int = 0
    """Each worker registers it (``InstanceInfo``): busy for routing past this many waiting."""
    backend: str = "fast"
    """"fast": ``SimWorker``; "engine": the real ``EngineCore`` + ``MockRunner`` (exact, slow;
    requests need ``token_ids``)."""
    host_kv_blocks: int = 0
    """Host-memory KV tier of each host, shared by its workers (``sim.tiers``); 0: none."""
    workers_per_host: int = 8
    host_load_s_per_block: float = 1e-4
    """Modelled seconds to load one block from the host tier."""
    ttft_slo_ms: float = 2000.0
    itl_slo_ms: float = 50.0
    """SLA targets for the report's attainment (a request meets the SLA when its TTFT and its
    mean inter-token time both do)."""
    planner: PlannerConfig | None = None
    """Let the planner grow and shrink the fleet (``num_workers`` is where it starts)."""
    fleet_schedule: tuple[tuple[float, int], ...] = ()
    """Instead of a planner's decisions, keep the fleet at these ``(from_s, size)`` sizes
    (``sim.planned.FleetSchedule``: the oracle behind causal bounds); needs ``planner`` for
    its interval, ramp and removal cost."""
    profile: CapabilityProfile | None = None
    """The capability profile for ``planner.policy == "sla"``."""
    startup_s: float = 30.0
    """A started worker joins the router this long after the planner asked for it."""

    def __post_init__(self) -> None:
        if self.num_workers < 1 and self.planner is None:
            raise ConfigError("a replay needs at least one worker")
        if self.fleet_schedule and self.planner is None:
            raise ConfigError("a fleet schedule needs a planner config (its interval, ramp and removal cost)")
        if self.startup_s < 0:
            raise ConfigError("startup_s must be >= 0")
        if not self.report_interval_s >= 0:
            raise ConfigError("report_interval_s must be >= 0")
        if self.host_kv_blocks < 0 or self.workers_per_host < 1:
            raise ConfigError("host_kv_blocks must be >= 0 and workers_per_host >= 1")
        if self.host_kv_blocks and self.backend != "fast":
            raise ConfigError("host KV tiers are modelled by the fast backend only")

    @property
    def worker_shape(self) -> WorkerShape:
        """Every worker's shape (either backend), from the fields above."""
        return WorkerShape(
            num_blocks=self.num_blocks,
            block_size=self.block_size,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_num_seqs=self.max_num_seqs,
            timing=TimingModel(self.engine_speedup),
            publish_events=self.publish_events,
            report_interval_s=self.report_interval_s,
        )

    @property
    def num_hosts(self) -> int:
        return -(-self.num_workers // self.workers_per_host)


REJECT_REASONS: dict[type[Exception], str] = {Overloaded: "queue full", NoWorkers: "no worker"}


class _Driver(WorkerSink):
    def __init__(self, cfg: ReplayConfig) -> None:
        self.cfg = cfg
        self.now = 0.0
        # The router prices prefill in steps of the workers' token budget.
        cost = replace(cfg.router.cost, chunk_tokens=cfg.max_num_batched_tokens)
        rcfg = replace(cfg.router, block_size=cfg.block_size, share_load=False, cost=cost)
        self.router = Router(rcfg, clock=lambda: self.now)
        self.workers: dict[str, Worker] = {}
        self.host_tiers: dict[int, SimTiers] = {}
        """Host index -> its shared host KV tier (workers w0.. fill hosts in order)."""
        self.started: dict[str, float] = {}
        """Running (or starting) worker -> when it was started."""
        self.ready: dict[str, float] = {}
        """Worker in the router -> when it joined."""
        self.draining: set[str] = set()
        self.stopped_worker_s = 0.0
        """Worker-seconds of workers already stopped."""
        self.heap: list[tuple[float, int, str, int]] = []
        self.timers: list[tuple[float, float, int, Callable[[], None]]] = []
        """(when, when asked, tie, what): timers due together run in the order they were asked
        for, even one asked for ahead (``SimWorker._next_event`` arms a pacing timer before
        the step whose report it sends has ended)."""
        self._tie = 0
        self._next_id = 0
        self.done: list[SimSeq] = []
        self.itl_s: list[float] = []
        self.itl_w: list[int] = []
        self.inflight_area: dict[str, float] = {}
        self._last_change: dict[str, float] = {}
        self.decisions: list[Decision] = []
        self.rejected: dict[str, int] = {}
        """Requests the router refused, by reason."""
        self._pending: dict[str, SimRequest] = {}
        self.arrived: list[tuple[SimRequest, int]] = []
        """Requests that arrived since the last ``take_arrivals`` (with their predicted cached
        tokens), for the planner's traffic view."""
        for _ in range(cfg.num_workers):
            self.join(self.start_worker())

    # ---- fleet changes (the planner connector drives them) ----
    def start_worker(self) -> str:
        cfg = self.cfg
        wid = f"w{self._next_id}"
        self._next_id += 1
        make: Callable[..., Worker] = EngineWorker
        if cfg.backend != "engine":
            tiers = None
            if cfg.host_kv_blocks:  # a shared tier is written through, as in the engine
                host = (self._next_id - 1) // cfg.workers_per_host
                if host not in self.host_tiers:
                    self.host_tiers[host] = SimTiers(
                        cfg.host_kv_blocks, cfg.host_load_s_per_block, cfg.workers_per_host > 1
                    )
                tiers = self.host_tiers[host]
            make = partial(SimWorker, tiers=tiers)
        self.workers[wid] = make(wid, cfg.worker_shape, sink=self)
        self.started[wid] = self.now
        self.inflight_area[wid] = 0.0
        self._last_change[wid] = self.now
        return wid

    def join(self, wid: str) -> None:
        """The started worker registers with the router (and reports once)."""
        cfg, w = self.cfg, self.workers[wid]
        self.router.add_worker(
            InstanceInfo(
                instance_id=wid,
                endpoint="sim.worker.generate",
                model="sim",
                block_size=cfg.block_size,
                kv_blocks_total=cfg.num_blocks,
                publishes_kv_events=cfg.publish_events,
                queue_depth_threshold=cfg.queue_depth_threshold,
            )
        )
        if wid in self.router.needs_resync():
            self.router.apply_events(w.snapshot(self.now))
        self.router.apply_load(w.load_report(self.now))
        self.ready[wid] = self.now
        self._dispatch_queued()

    def drain(self, wid: str) -> None:
        """No new requests for ``wid``; it stops once its last one finishes."""
        self.draining.add(wid)
        if wid not in self.ready:
            self.stop(wid)  # still starting: nothing to drain
            return
        self.router.apply_load(self.load_report(wid))
        if self.workers[wid].num_inflight == 0:
            self.stop(wid)

    def stop(self, wid: str) -> None:
        self._account(self.workers[wid], self.now, 0)
        self.router.remove_worker(wid)
        self.stopped_worker_s += self.now - self.started.pop(wid)
        self.ready.pop(wid, None)
        self.draining.discard(wid)
        del self.workers[wid]

    def load_report(self, wid: str) -> LoadReport:
        return self._marked(self.workers[wid].load_report(self.now))

    def _marked(self, report: LoadReport) -> LoadReport:
        if report.instance_id in self.draining:
            return msgspec.structs.replace(report, draining=True)
        return report

    def call_at(self, t: float, fn: Callable[[], None], asked_at: float | None = None) -> None:
        self._tie += 1
        heapq.heappush(self.timers, (t, self.now if asked_at is None else asked_at, self._tie, fn))

    def worker_seconds(self) -> float:
        return self.stopped_worker_s + sum(self.now - t for t in self.started.values())

    def take_arrivals(self) -> list[tuple[SimRequest, int]]:
        out, self.arrived = self.arrived, []
        return out

    # ---- sink ----
    def first_token(self, worker: object, seq: SimSeq, t: float) -> None:
        self.router.on_first_token(seq.req.request_id)

    def finished(self, worker: object, seq: SimSeq, t: float) -> None:
        assert isinstance(worker, SimWorker | EngineWorker)
        self._account(worker, t, -1)
        self.router.on_finish(seq.req.request_id)
        self.done.append(seq)

    def kv_events(self, batch: KVEventBatch) -> None:
        self.router.apply_events(batch)

    def load(self, report: LoadReport) -> None:
        self.router.apply_load(self._marked(report))

    def wake(self, worker: object, t: float, asked_at: float | None = None) -> None:
        assert isinstance(worker, SimWorker | EngineWorker) and t >= self.now
        self.call_at(t, partial(self._send_held_load, worker), asked_at)

    def _send_held_load(self, w: Worker) -> None:
        if self.workers.get(w.instance_id) is w:  # not stopped meanwhile
            self._schedule(w, w.send_held_load(self.now))

    def polls_steps(self) -> bool:
        return bool(self._pending)

    def itl(self, step_s: float, tokens: int) -> None:
        self.itl_s.append(step_s)
        self.itl_w.append(tokens)

    def itl_many(self, step_s: list[float], tokens: int) -> None:
        self.itl_s += step_s
        self.itl_w += [tokens] * len(step_s)

    # ---- loop ----
    def _account(self, w: Worker, t: float, delta: int) -> None:
        wid = w.instance_id
        self.inflight_area[wid] += (t - self._last_change[wid]) * w.num_inflight
        self._last_change[wid] = t

    def _schedule(self, w: Worker, end: float | None) -> None:
        if end is not None:
            self._tie += 1
            heapq.heappush(self.heap, (end, self._tie, w.instance_id, w.version))

    def _send(self, req: SimRequest, wid: str) -> None:
        w = self.workers[wid]
        self._account(w, self.now, +1)
        w.enqueue(req, self.now)
        if w.step is None:
            self._schedule(w, w.start_step(self.now))
        else:
            self._schedule(w, w.cut(self.now))

    def arrive(self, req: SimRequest) -> None:
        meta = RequestMeta(
            request_id=req.request_id,
            prompt_tokens=req.prompt_tokens,
            max_tokens=req.output_tokens,
            session_id=req.session_id,
            priority=req.priority,
        )
        try:
            d = self.router.route(meta, block_hashes=req.block_hashes)
        except (Overloaded, NoWorkers) as e:
            reason = REJECT_REASONS[type(e)]
            self.rejected[reason] = self.rejected.get(reason, 0) + 1
            self.arrived.append((req, 0))
            return
        if isinstance(d, Decision):
            self.decisions.append(d)
            self.arrived.append((req, d.cached_tokens))
            self._send(req, d.worker_id)
        else:
            self.arrived.append((req, 0))
            if not self._pending:  # the router tries its queue at every step end from now on
                for w in self.workers.values():
                    if isinstance(w, SimWorker):
                        self._schedule(w, w.repoll(self.now))
            self._pending[req.request_id] = req

    def step_end(self, wid: str, version: int) -> None:
        w = self.workers.get(wid)
        if w is None or w.version != version or w.step is None:
            return
        w.finish_step(self.now)
        self._schedule(w, w.start_step(self.now))
        if wid in self.draining and w.num_inflight == 0:
            self.stop(wid)
        self._dispatch_queued()

    def _dispatch_queued(self) -> None:
        if self._pending:
            for d in self.router.dispatch_queued():
                self.decisions.append(d)
                self._send(self._pending.pop(d.request_id), d.worker_id)

    def _stepping(self) -> bool:
        return any(w.step is not None for w in self.workers.values())

    def run(self, requests: Sequence[SimRequest]) -> None:
        """Until every request has arrived and no worker has work left (timers alone do not
        keep the replay going, but a worker whose stretch waits on its pacing timer does)."""
        i, n = 0, len(requests)
        inf = float("inf")
        while i < n or self.heap or (self.timers and self._stepping()):
            t_arr = requests[i].arrival_s if i < n else inf
            t_step = self.heap[0][0] if self.heap else inf
            t_timer = self.timers[0][0] if self.timers else inf
            if t_timer < t_arr and t_timer < t_step:
                self.now, _, _, fn = heapq.heappop(self.timers)
                fn()
            elif t_step <= t_arr:
                t, _, wid, version = heapq.heappop(self.heap)
                self.now = t
                self.step_end(wid, version)
            else:
                self.now = t_arr
                self.arrive(requests[i])
                i += 1
        for w in self.workers.values():
            self._account(w, self.now, 0)


def replay(requests: Sequence[SimRequest], cfg: ReplayConfig | None = None) -> ReplayReport:
    """Replay ``requests`` (sorted by arrival) and report."""
    cfg = cfg or ReplayConfig()
    reqs = sorted(requests, key=lambda r: r.arrival_s)
    t0 = time.perf_counter()
    drv = _Driver(cfg)
    planned = None
    if cfg.planner is not None:
        planned = PlannerConnector(drv, cfg.planner, cfg.profile, cfg.router.policy, cfg.fleet_schedule)
    drv.run(reqs)
    wall = time.perf_counter() - t0
    hosts = max(cfg.num_hosts, len(drv.host_tiers))
    total_blocks = cfg.num_workers * cfg.num_blocks + hosts * cfg.host_kv_blocks
    upper, pooled = cache_bounds(reqs, cfg.block_size, total_blocks)
    per_worker_reqs = dict.fromkeys(drv.inflight_area, 0)
    for d in drv.decisions:
        per_worker_reqs[d.worker_id] += 1
    return build_report(
        policy=cfg.router.policy,
        done=drv.done,
        upper_bound=upper,
        pooled_bound=pooled,
        itl_s=np.asarray(drv.itl_s),
        itl_w=np.asarray(drv.itl_w),
        inflight_area=drv.inflight_area,
        duration_s=drv.now,
        per_worker_requests=per_worker_reqs,
        decision_s=np.asarray([d.decision_s for d in drv.decisions]),
        wall_s=wall,
        num_submitted=len(reqs),
        rejected=drv.rejected,
        worker_seconds=drv.worker_seconds(),
        slo_ms=(cfg.ttft_slo_ms, cfg.itl_slo_ms),
        decisions=tuple(planned.planner.history) if planned else (),
    )
