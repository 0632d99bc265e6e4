"""Virtual-time trace replay: N simulated workers behind a real ``Router``.

One event loop over two sources, in time order: request arrivals (routed by the router on the
spot, with the router's clock set to virtual time) and worker step ends. A worker's KV events
and load reports reach the router at the end of each step (no transport delay), its first
tokens and finishes update the router's dispatch accounting, exactly as the async glue does
with real processes. Requests the router queues (every worker busy) are dispatched after each
finish. A request the router refuses (its admission queue full: ``Overloaded``; no worker
could take it: ``NoWorkers``) is counted as rejected, with the reason, as a deployment would
answer 503; a replay past overload finishes and reports them next to the rest.

The report compares the prefix-cache hit ratio with the trace's infinite-cache upper bound and
the pooled-cache bound (one LRU cache as large as all workers together, ``sim.bounds``), and
gives TTFT and ITL percentiles, throughput, and per-worker load imbalance.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import partial

import numpy as np

from interlock.engine.timing import TimingModel
from interlock.errors import ConfigError, NoWorkers, Overloaded
from interlock.protocol.discovery import InstanceInfo
from interlock.protocol.events import KVEventBatch, LoadReport
from interlock.router import Decision, RequestMeta, Router, RouterConfig
from interlock.sim.bounds import infinite_cache_hit_ratio, pooled_cache_hit_ratio
from interlock.sim.engine_worker import EngineWorker
from interlock.sim.report import ReplayReport, build_report
from interlock.sim.tiers import SimTiers
from interlock.sim.trace import SimRequest
from interlock.sim.worker import SimSeq, SimWorker, WorkerSink

Worker = SimWorker | EngineWorker


@dataclass(frozen=True)
class ReplayConfig:
    num_workers: int = 8
    num_blocks: int = 61_000
    """KV blocks per worker."""
    block_size: int = 64
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    engine_speedup: float = 1.0
    """Divides modelled step times (Dynamo's ``--speedup-ratio``); arrival speed-up is applied
    when building the requests."""
    publish_events: bool = True
    """False: workers publish no KV events (the router predicts their caches)."""
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

    def __post_init__(self) -> None:
        if self.host_kv_blocks < 0 or self.workers_per_host < 1:
            raise ConfigError("host_kv_blocks must be >= 0 and workers_per_host >= 1")
        if self.host_kv_blocks and self.backend != "fast":
            raise ConfigError("host KV tiers are modelled by the fast backend only")

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
        shared = cfg.workers_per_host > 1  # a shared tier is written through, as in the engine
        self.host_tiers = [SimTiers(cfg.host_kv_blocks, cfg.host_load_s_per_block, shared)
                           for _ in range(cfg.num_hosts)] if cfg.host_kv_blocks else []
        for i in range(cfg.num_workers):
            wid = f"w{i}"
            tiers = self.host_tiers[i // cfg.workers_per_host] if self.host_tiers else None
            make = EngineWorker if cfg.backend == "engine" else partial(SimWorker, tiers=tiers)
            self.workers[wid] = make(
                wid, num_blocks=cfg.num_blocks, block_size=cfg.block_size,
                max_num_batched_tokens=cfg.max_num_batched_tokens,
                max_num_seqs=cfg.max_num_seqs, timing=TimingModel(cfg.engine_speedup),
                publish_events=cfg.publish_events, sink=self)
            self.router.add_worker(InstanceInfo(
                instance_id=wid, endpoint="sim.worker.generate", model="sim",
                block_size=cfg.block_size, kv_blocks_total=cfg.num_blocks,
                publishes_kv_events=cfg.publish_events,
                queue_depth_threshold=cfg.queue_depth_threshold))
        for wid in self.router.needs_resync():
            self.router.apply_events(self.workers[wid].snapshot(0.0))
        for w in self.workers.values():
            self.router.apply_load(w.load_report(0.0))  # a worker reports once when it starts
        self.heap: list[tuple[float, int, str, int]] = []
        self._tie = 0
        self.done: list[SimSeq] = []
        self.itl_s: list[float] = []
        self.itl_w: list[int] = []
        self.inflight_area = dict.fromkeys(self.workers, 0.0)
        self._last_change = dict.fromkeys(self.workers, 0.0)
        self.decisions: list[Decision] = []
        self.rejected: dict[str, int] = {}
        """Requests the router refused, by reason."""

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
        self.router.apply_load(report)

    def itl(self, step_s: float, tokens: int) -> None:
        self.itl_s.append(step_s)
        self.itl_w.append(tokens)

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
        meta = RequestMeta(request_id=req.request_id, prompt_tokens=req.prompt_tokens,
                           max_tokens=req.output_tokens, session_id=req.session_id,
                           priority=req.priority)
        try:
            d = self.router.route(meta, block_hashes=req.block_hashes)
        except (Overloaded, NoWorkers) as e:
            reason = REJECT_REASONS[type(e)]
            self.rejected[reason] = self.rejected.get(reason, 0) + 1
            return
        if isinstance(d, Decision):
            self.decisions.append(d)
            self._send(req, d.worker_id)
        else:
            self._pending[req.request_id] = req

    def step_end(self, wid: str, version: int) -> None:
        w = self.workers[wid]
        if w.version != version or w.step is None:
            return
        w.finish_step(self.now)
        self._schedule(w, w.start_step(self.now))
        if self._pending:
            for d in self.router.dispatch_queued():
                self.decisions.append(d)
                self._send(self._pending.pop(d.request_id), d.worker_id)

    def run(self, requests: Sequence[SimRequest]) -> None:
        self._pending: dict[str, SimRequest] = {}
        i, n = 0, len(requests)
        while i < n or self.heap:
            t_arr = requests[i].arrival_s if i < n else float("inf")
            if self.heap and self.heap[0][0] <= t_arr:
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
    drv.run(reqs)
    wall = time.perf_counter() - t0
    upper = infinite_cache_hit_ratio(reqs, cfg.block_size)
    total_blocks = cfg.num_workers * cfg.num_blocks + cfg.num_hosts * cfg.host_kv_blocks
    pooled = pooled_cache_hit_ratio(reqs, cfg.block_size, total_blocks)
    per_worker_reqs = {wid: 0 for wid in drv.workers}
    for d in drv.decisions:
        per_worker_reqs[d.worker_id] += 1
    return build_report(
        policy=cfg.router.policy, done=drv.done, upper_bound=upper, pooled_bound=pooled,
        itl_s=np.asarray(drv.itl_s), itl_w=np.asarray(drv.itl_w),
        inflight_area=drv.inflight_area, duration_s=drv.now, per_worker_requests=per_worker_reqs,
        decision_s=np.asarray([d.decision_s for d in drv.decisions]), wall_s=wall,
        num_submitted=len(reqs), rejected=drv.rejected,
    )
