"""The router's async glue: planes in, decisions out. Implements the frontend's ``Backend``.

No decisions are made here: ``Router`` (one per served model) decides; this shell keeps it fed
(discovery -> workers, event plane -> KV events and load reports, other routers' dispatch
load) and asks workers for a snapshot when their event stream has a gap or they (re)join.
Each request's life (route, stream, retry, migrate, finish) belongs to the ``Dispatcher``
(``router.dispatcher``), for the aggregated and the disaggregated path alike.

Scale to zero: a model served on demand (``expect_model``: a planner whose minimum is 0 starts
its workers) may have no worker right now (its pool stopped while idle, or started empty). A
request for it waits for one (``router_when_ready``) instead of failing: bounded in number (the
router's ``queue_capacity`` per model, ``Overloaded`` past it) and in time (the dispatcher's
``queue_timeout_s``, then ``NoWorkers``), counted in ``waiting_for_worker`` so the planner,
which reads it as part of the router's queue (``planner/live.py``), starts a worker. Any other
model with no worker answers 503 + Retry-After at once: nobody is going to start one for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
import zlib
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

import msgspec

from interlock.errors import ConfigError, ModelNotFound, NoWorkers, Overloaded
from interlock.metrics import Registry
from interlock.metrics.events import EVENTS
from interlock.names import KV_INDEX_MODES
from interlock.protocol import (
    GenerateOutput,
    GenerateRequest,
    InstanceInfo,
    KVEventBatch,
    LoadReport,
    subjects,
)
from interlock.protocol.control import ControlRequest
from interlock.protocol.discovery import ADDRESS_SCHEMES, instance_problem
from interlock.protocol.events import RouterLoadEvent
from interlock.protocol.kv_sync import KV_LOOKUP_ENDPOINT, KV_REPLICA_ENDPOINT, REPLICA_ID_PREFIX
from interlock.protocol.routing import ModelEntry, RequestContext
from interlock.router.breaker import BreakerConfig, Breakers
from interlock.router.disagg import DisaggConfig
from interlock.router.disagg_flow import DisaggFlow
from interlock.router.dispatcher import EXPLAIN_HEADER, Dispatcher, DispatchOptions
from interlock.router.kv_lookup import KvLookupClient, KvLookupServer, RemoteChain
from interlock.router.kv_replica import KvReplicaServer
from interlock.router.kv_sync import KvSync
from interlock.router.model_card import Card, card_of
from interlock.router.model_router import Router, RouterConfig
from interlock.router.roster import Roster
from interlock.router.shards import Shard, parse_shard
from interlock.router.worker_control import control_call
from interlock.runtime.interfaces import Discovery, DiscoveryEvent, EventPlane, RequestPlane
from interlock.runtime.link import ControlLink

log = logging.getLogger(__name__)

_encode = msgspec.msgpack.Encoder().encode
_decode_batch = msgspec.msgpack.Decoder(KVEventBatch).decode
_decode_load = msgspec.msgpack.Decoder(LoadReport).decode
_FromWorker = TypeVar("_FromWorker", KVEventBatch, LoadReport)
_decode_router_load = msgspec.msgpack.Decoder(list[RouterLoadEvent] | RouterLoadEvent).decode

SHARE_INTERVAL_S = 0.01
"""Dispatch load for other routers leaves in one message per this interval (not one per event:
three NATS messages per request, each echoed back, were a fifth of the frontend's time)."""

TURN_S = 0.002
"""The longest stretch of worker messages (KV events, load reports) taken in one turn of the
event loop before requests get theirs."""

_PREFETCH_TIMEOUT_S = 300.0
"""The longest a weight prefetch is waited for (a large model from a cold disk)."""

PING_MISSES = 2
"""Health checks a worker fails in a row before it gets no requests. One late answer is no sign
of a fault (its event loop held for a moment by a grammar compiled or a slow step on busy
cores), and taking the only worker out for it refused every request meanwhile (503)."""

__all__ = ["EXPLAIN_HEADER", "RouterService", "ServiceOptions"]


@dataclass(frozen=True)
class ServiceOptions:
    dispatch: DispatchOptions = DispatchOptions()
    """Retries, migration, stall timeouts, queue timeout (``router.dispatcher``)."""
    breaker: BreakerConfig = BreakerConfig()
    share_load: bool = True
    """Publish dispatch-time load for other routers, and apply theirs."""
    health_check_s: float | None = None
    """Ping every worker this often; one that fails ``PING_MISSES`` pings in a row gets no
    requests until it answers one (None: rely on discovery leases and request failures alone)."""
    replica: bool = True
    """Serve this router's index to other router replicas (registered in discovery under the
    router's id) and copy workers' states from theirs before asking the workers
    (``router/kv_replica.py``)."""
    kv_index: str = "local"
    """``local``: keep the fleet's KV index here (ingest every KV event, pull workers' states)
    and answer other frontends' lookups; ``remote``: keep none, ask a replica with one per
    request (``router/kv_lookup.py``): several frontends then share one ingestion."""
    kv_shard: str = ""
    """``I/N``: with ``local``, keep only shard I of N of the index (the workers
    ``router.shards`` gives it) and route by asking every shard, as ``remote`` asks one
    replica; "": the whole index."""

    def __post_init__(self) -> None:
        shard = parse_shard(self.kv_shard)
        if shard[1] > 1 and self.kv_index != "local":
            raise ConfigError(
                "kv_shard: a shard of the index is kept with kv_index 'local'", param="kv_shard"
            )
        if shard[1] > 1 and not self.replica:
            raise ConfigError("kv_shard: the shards find each other through replica=True", param="kv_shard")
        if self.kv_index not in KV_INDEX_MODES:
            raise ConfigError(
                f"kv_index must be one of {', '.join(KV_INDEX_MODES)}, not {self.kv_index!r}",
                param="kv_index",
            )
        if self.kv_index == "remote" and not self.replica:
            raise ConfigError(
                "kv_index 'remote' finds the replicas to ask through replica=True", param="kv_index"
            )


_TIER_METRICS = (
    ("blocks", "blocks"),
    ("capacity_blocks", "capacity"),
    ("hits_total", "hits"),
    ("loads_total", "loads"),
    ("load_failures_total", "load_failures"),
    ("load_seconds_total", "load_s"),
    ("evictions_total", "evictions"),
    ("load_timeouts_total", "load_timeouts"),
    ("write_failures_total", "write_failures"),
)
"""Per worker and KV tier below its device pool (``LoadReport.kv_tiers``): metric suffix, field."""


class RouterService:
    def __init__(
        self,
        *,
        discovery: Discovery,
        requests: RequestPlane,
        events: EventPlane,
        config: RouterConfig | None = None,
        options: ServiceOptions = ServiceOptions(),
        router_id: str | None = None,
        disagg: DisaggConfig | None = None,
        link: ControlLink | None = None,
    ) -> None:
        self._discovery = discovery
        self._requests = requests
        self._events = events
        self._config = config or RouterConfig()
        self._options = options
        self.router_id = router_id or uuid.uuid4().hex[:12]
        self.routers: dict[str, Router] = {}
        self._roster = Roster()
        """Routed and held workers, filed by model and card: a join or a leave is O(1)."""
        self._instances = self._roster.routed
        """Routed workers by id (read only: through ``_roster``)."""
        self._tasks: list[asyncio.Task[None]] = []
        self._prefetching: set[asyncio.Task[None]] = set()
        """Weight prefetches under way (``prefetch``)."""
        self.prefetches: Counter[str] = Counter()
        """Weight prefetches ended, by outcome (``loaded``, ``failed``)."""
        self._changed = asyncio.Event()
        self._reports: dict[str, LoadReport] = {}
        self._known_models: dict[str, ModelEntry] = {}
        self._on_demand: set[str] = set()
        """Models whose workers a planner starts when requests wait (``expect_model``)."""
        self._waiting: Counter[str] = Counter()
        """Requests waiting for a model's first eligible worker, by model (no zero counts)."""
        self._closing = False
        self._held = self._roster.held
        """Workers whose card the model's majority disagrees with (``model_card``): not routed."""
        self._shared_out: list[RouterLoadEvent] = []
        self._share_timer: asyncio.TimerHandle | None = None
        self.requests = requests
        """The request plane (streams to workers, control calls)."""
        self.dispatcher = Dispatcher(self, options.dispatch, Breakers(options.breaker))
        self.disagg = DisaggFlow(self, self.dispatcher, disagg) if disagg is not None else None
        """Disaggregated prefill/decode (``router.disagg_flow``); None: aggregated only."""
        self.dispatcher.disagg = self.disagg
        self._replicas: dict[str, str] = {}
        """Other router replicas' ``kv_replica`` addresses by router id."""
        self.kv_sync = KvSync(requests, self._ask_snapshot, peers=self._replicas_for)
        """Pulls of workers' KV state: a gap replayed, a whole cache (``router/kv_sync.py``)."""
        self.kv_replica = KvReplicaServer(self._kv_export)
        """This router's index, served to other replicas (``router/kv_replica.py``)."""
        self._replica_address: str | None = None
        self._remote = options.kv_index == "remote"
        """No KV index here: a replica with one is asked per request (``router/kv_lookup.py``)."""
        self._shard = Shard(*parse_shard(options.kv_shard))
        """The part of the index kept here (``router/shards.py``): its workers' events and states."""
        self._asks = self._remote or not self._shard.whole
        """Requests are routed on the replicas' lookups (every shard's, where it is sharded)."""
        self.kv_lookup = KvLookupClient(requests)
        self.kv_lookup_server = KvLookupServer(
            self.routers.get, None if self._shard.whole else self._shard.owns
        )
        self._replica_shards: dict[str, tuple[int, int]] = {}
        """Other replicas' shards of the index, by router id."""
        self._kv_followed: dict[str, asyncio.Task[None]] = {}
        """A shard's subscriptions to its own workers' KV subjects, by worker id."""
        self._lookup_address: str | None = None
        self._link = link
        self.degraded_sources: list[Callable[[], list[str]]] = []
        """More sources of ``degraded`` reasons (``serve`` adds its process supervisor)."""
        self.metrics_registry = Registry()
        """This service's figures (the frontend serving it includes them in its ``/metrics``)."""
        self._register_metrics(self.metrics_registry)

    # ---- lifecycle ----
    async def start(self) -> None:
        load = await self._events.subscribe(subjects.LOAD_ALL)
        loops = [self._watch(), self._on_load(load), self._ticks()]
        if not self._remote and self._shard.whole:  # a shard follows its own workers' subjects only
            loops.append(self._on_kv(await self._events.subscribe(subjects.KV_ALL)))
        if self._options.replica:  # the replicas known before the first worker is pulled
            if not self._remote:  # a replica with an index: it serves it
                await self._serve_replica()
            for info in await self._discovery.instances(KV_REPLICA_ENDPOINT):
                self._on_replica(DiscoveryEvent("added", info))
            loops.append(self._watch_replicas())
        if self.disagg is not None:
            loops.append(self.disagg.link_loop())
        if self._options.share_load:
            shared = await self._events.subscribe(subjects.ROUTER_LOAD_ALL)
            loops.append(self._on_router_load(shared))
        if self._options.health_check_s:
            loops.append(self._health_checks(self._options.health_check_s))
        self._tasks = [asyncio.create_task(c) for c in loops]

    async def close(self) -> None:
        self._closing = True
        self._changed.set()  # requests waiting for a worker: none will come now
        if self._share_timer is not None:
            self._share_timer.cancel()
            self._share_timer = None
        tasks = [*self._tasks, *self._prefetching]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks = []
        if self._replica_address is not None:
            with contextlib.suppress(Exception):  # closing: the lease expires anyway
                await self._discovery.unregister(self._replica_id)
                await self._requests.unserve(self._replica_address)
                if self._lookup_address is not None:
                    await self._requests.unserve(self._lookup_address)
            self._replica_address = self._lookup_address = None
        for task in self._kv_followed.values():
            task.cancel()
        await asyncio.gather(*self._kv_followed.values(), return_exceptions=True)
        self._kv_followed.clear()
        await self.kv_sync.close()
        self.dispatcher.close()

    async def wait_for_workers(self, count: int, timeout_s: float) -> int:
        """Wait until ``count`` workers are known (or the timeout); return how many are."""
        deadline = time.monotonic() + timeout_s
        while len(self._instances) < count:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)
        return len(self._instances)

    async def router_when_ready(
        self, model: str, timeout_s: float, role: str | None = None, *, arriving: bool = False
    ) -> Router | None:
        """The model's router once it has an eligible worker (of ``role``, or any; None after
        ``timeout_s``): a request waits out a moment with no worker (one restarting, a lease
        that lapsed while its worker was busy, a pool scaled to zero that a planner restarts)
        instead of failing. While it waits it counts in ``waiting_for_worker``. ``arriving``: a
        request not yet admitted anywhere, refused with ``Overloaded`` when the model already
        has ``queue_capacity`` waiting (a request already under way, a retry or a migration,
        is never refused here). ``NoWorkers`` when the service closes meanwhile."""
        router = self.routers.get(model)
        if router is not None and router.has_eligible(role):
            return router
        cap = self._config.queue_capacity
        if arriving and self._waiting[model] >= cap:
            raise Overloaded(
                f"no worker serves '{model}' yet and {self._waiting[model]} requests already wait "
                f"for one (queue_capacity {cap}: the deployment's routing.queue_size)",
                retry_after=self._config.retry_after_s,
            )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        self._waiting[model] += 1
        try:
            while True:
                if self._closing:
                    raise NoWorkers("router shutting down")
                router = self.routers.get(model)
                if router is not None and router.has_eligible(role):
                    return router
                left = deadline - loop.time()
                if left <= 0:
                    return None
                self._changed.clear()
                # A join sets ``_changed``; health and breakers do not, hence the poll.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), min(left, 0.25))
        finally:  # answered, timed out, or cancelled (the client left): out of the count
            self._waiting[model] -= 1
            if self._waiting[model] <= 0:
                del self._waiting[model]

    def prefetch(self, model: str) -> None:
        """A request for ``model`` arrived: where it would otherwise wait for weights a worker
        offloaded while idle (``Router.weights_to_wake``), ask that worker to load them now, so
        they load while the request is templated, tokenized and routed."""
        router = self.routers.get(model)
        wid = router.weights_to_wake() if router is not None else None
        info = self._instances.get(wid) if wid is not None else None
        address = info.metadata.get("control_address") if info is not None else None
        if router is None or wid is None:
            return
        if not address:  # nobody to ask: its wait is priced again
            router.wake_failed(wid)
            return
        task = asyncio.create_task(self._load_weights(router, wid, address), name=f"prefetch-{wid[:32]}")
        self._prefetching.add(task)
        task.add_done_callback(self._prefetching.discard)

    async def _load_weights(self, router: Router, instance_id: str, address: str) -> None:
        try:
            reply = await asyncio.wait_for(
                control_call(self.requests, address, ControlRequest(op="load_weights")), _PREFETCH_TIMEOUT_S
            )
        except Exception as exc:  # noqa: BLE001 - a prefetch that fails costs only its time
            log.warning("prefetching %s's weights failed: %s", instance_id, exc)
            self.prefetches["failed"] += 1
            router.wake_failed(instance_id)
            return
        if not reply.ok:
            log.warning("prefetching %s's weights failed: %s", instance_id, reply.error)
            router.wake_failed(instance_id)
        self.prefetches["loaded" if reply.ok else "failed"] += 1
        if reply.weights_load_s:
            log.info("prefetched %s's weights in %.2f s", instance_id, reply.weights_load_s)

    def waiting_for_worker(self, model: str | None = None) -> int:
        """Requests waiting for an eligible worker of ``model`` (None: of every model): at a pool
        scaled to zero, or between legs with every worker gone (``router_when_ready``)."""
        return self._waiting[model] if model is not None else sum(self._waiting.values())

    def expect_model(self, entry: ModelEntry, *, on_demand: bool = False) -> None:
        """Serve ``entry`` before any worker of it registers (the deployment names it): it is
        listed, and its requests get 503 + Retry-After instead of a 404 while it has no worker.
        The first workers' card replaces ``entry``'s, as any card follows its live workers
        (``model_card``). ``on_demand``: its workers are started when requests wait (a planner
        whose minimum is 0), so its requests wait for a worker instead (``router_when_ready``)
        and having none is no health problem."""
        if not entry.name or not entry.model_path or entry.context_length < 1:
            raise ConfigError(
                f"expect_model: a model needs a name, a model_path and a context_length >= 1, not {entry}"
            )
        self._known_models.setdefault(entry.name, entry)
        if on_demand:
            self._on_demand.add(entry.name)
        else:
            self._on_demand.discard(entry.name)

    # ---- Backend ----
    def models(self) -> list[ModelEntry]:
        """Every model a valid worker has served since start, and every one ``expect_model``
        declared: one whose workers are all gone stays listed, so its requests get 503 +
        Retry-After (not 404; an on-demand model's wait for a worker) until one comes back.
        Its card is the one most of its live workers announce (``model_card``), or, with none
        live, the last one; a refused or held registration never shapes it alone."""
        return sorted(self._known_models.values(), key=lambda m: m.name)

    def health(self) -> list[str]:
        """Problems that keep a served model from being served at all (empty: every model has
        a worker taking requests). An on-demand model (``expect_model``) with no worker at all
        is scaled to zero, not broken: its requests start one."""
        return [f"model '{m}' has no live worker" for m in sorted(self._known_models) if self._unservable(m)]

    def _unservable(self, model: str) -> bool:
        router = self.routers.get(model)
        if router is None:
            return model not in self._on_demand
        return not any(router.is_eligible(w) for w in router.workers())

    def degraded(self) -> list[str]:
        """What is wrong while requests are still served: a process restarting or crash
        looping, the control plane unreachable, workers heard only on their request plane."""
        found: list[str] = []
        for source in self.degraded_sources:
            found += source()
        if self._link is not None and (status := self._link.status()).state != "connected":
            found.append(f"control plane unreachable for {status.since_s:.0f} s ({status.reason})")
        found += [
            f"worker {i.instance_id} held out of routing: it announces {card_of(i)}, model "
            f"'{i.model}' is {self._current_card(i.model)}"
            for i in self._held.values()
        ]
        vouched = self._discovery.vouched()
        if vouched:
            found.append(
                f"{len(vouched)} worker(s) silent on the control plane, kept by request-plane checks"
            )
        return found

    def health_details(self) -> dict[str, object]:
        """The control plane's state, for ``/health``'s body."""
        link: dict[str, object] = {"state": "in-process"}
        if self._link is not None:
            status = self._link.status()
            link = {
                "state": status.state,
                "since_s": round(status.since_s, 1),
                "outages": status.outages,
                **({"reason": status.reason} if status.reason else {}),
            }
        return {"control_plane": link, "vouched_workers": self._discovery.vouched()}

    def instances(self) -> list[InstanceInfo]:
        return sorted(self._instances.values(), key=lambda i: i.instance_id)

    def num_workers(self) -> int:
        """How many workers are routed: ``len(instances())`` without listing and sorting them."""
        return len(self._instances)

    def has_prefill(self, router: Router) -> bool:
        """``router``'s model has a routed prefill worker (O(models), not O(workers))."""
        model = self._model_of(router)
        return model is not None and self._roster.prefill(model) > 0

    def _model_of(self, router: Router) -> str | None:
        """The model ``router`` routes (a scan of the models, not of the workers)."""
        return next((m for m, r in self.routers.items() if r is router), None)

    def instance(self, instance_id: str) -> InstanceInfo | None:
        return self._instances.get(instance_id)

    def report(self, instance_id: str) -> LoadReport | None:
        """The worker's last load report."""
        return self._reports.get(instance_id)

    def generate(
        self, request: GenerateRequest, ctx: RequestContext | None = None
    ) -> AsyncIterator[GenerateOutput]:
        """``Backend.generate``. An on-demand model with no eligible worker now (scaled to
        zero, its last worker draining) is not refused: the dispatcher waits for one first."""
        model = request.model
        router = self.routers.get(model)
        if model in self._on_demand and (router is None or not router.has_eligible()):
            return self.dispatcher.generate(None, request, ctx)
        if router is None:
            if model in self._known_models:
                raise NoWorkers(f"no worker is serving '{model}' right now", retry_after=1.0)
            raise ModelNotFound(f"The model '{model}' does not exist")
        return self.dispatcher.generate(router, request, ctx)

    def prometheus_text(self) -> str:
        """This service's figures in Prometheus text format (the frontend serves them with its
        own: ``metrics_registry``)."""
        return self.metrics_registry.render()

    def metrics_targets(self) -> list[tuple[str, str]]:
        """``(worker id, host:port)`` of every worker that serves its own ``/metrics``."""
        out = []
        for wid, info in sorted(self._instances.items()):
            address = info.metadata.get("metrics_address")
            if address:
                out.append((wid, address))
        return out

    def _register_metrics(self, reg: Registry) -> None:
        """Every figure of this service, read at scrape time (docs/metrics.md)."""
        reg.collect("interlock_control_plane_up", self._plane_up)
        reg.collect("interlock_control_plane_outages_total", self._plane_outages)
        reg.collect("interlock_workers_vouched", lambda: (((), len(self._discovery.vouched())),))
        reg.collect("interlock_workers", self._worker_counts)
        per_worker: tuple[tuple[str, Callable[[LoadReport], float]], ...] = (
            ("interlock_worker_kv_blocks_used", lambda r: r.kv_blocks_used),
            ("interlock_worker_kv_blocks_capacity", lambda r: r.kv_blocks_total),
            ("interlock_worker_kv_usage_ratio", lambda r: r.kv_usage),
            ("interlock_worker_running_requests", lambda r: r.num_running),
            ("interlock_worker_waiting_requests", lambda r: r.num_waiting),
            ("interlock_worker_busy_seconds_total", lambda r: r.busy_s),
            ("interlock_worker_weights_out_seconds", lambda r: r.weights_load_s),
        )
        for name, get in per_worker:
            reg.collect(name, partial(self._per_worker, get))
        reg.collect(
            "interlock_worker_kv_handoffs_total",
            lambda: [((*labels, o), n) for labels, r in self._labelled_reports() for o, n in r.kv_handoffs],
        )
        for name, attr in _TIER_METRICS:
            reg.collect(
                f"interlock_worker_kv_tier_{name}",
                partial(self._per_tier, attr),
            )
        self._register_router_metrics(reg)
        self._register_kv_sync_metrics(reg)
        self.dispatcher.register_metrics(reg)
        if self.disagg is not None:
            self.disagg.register_metrics(reg)

    def _per_worker(self, get: Callable[[LoadReport], float]) -> list[tuple[tuple[str, ...], float]]:
        return [(labels, get(r)) for labels, r in self._labelled_reports()]

    def _per_tier(self, attr: str) -> list[tuple[tuple[str, ...], float]]:
        return [
            ((*labels, t.tier), getattr(t, attr))
            for labels, r in self._labelled_reports()
            for t in r.kv_tiers
        ]

    def _per_model(self, get: Callable[[Router], float]) -> list[tuple[tuple[str, ...], float]]:
        return [((m,), get(r)) for m, r in sorted(self.routers.items())]

    def _plane_up(self) -> list[tuple[tuple[str, ...], float]]:
        return [] if self._link is None else [((), float(self._link.status().state == "connected"))]

    def _plane_outages(self) -> list[tuple[tuple[str, ...], float]]:
        return [] if self._link is None else [((), float(self._link.status().outages))]

    def _worker_counts(self) -> list[tuple[tuple[str, ...], float]]:
        counts: dict[tuple[str, str], int] = {}
        for info in self._instances.values():
            key = (info.model, info.role)
            counts[key] = counts.get(key, 0) + 1
        return [(k, float(n)) for k, n in sorted(counts.items())]

    def _labelled_reports(self) -> list[tuple[tuple[str, str], LoadReport]]:
        """``((worker, model), report)`` per worker with a report, by worker id (the model empty
        once it left)."""
        out = []
        for wid, r in sorted(self._reports.items()):
            model = self._instances[wid].model if wid in self._instances else ""
            out.append(((wid, model), r))
        return out

    def _register_kv_sync_metrics(self, reg: Registry) -> None:
        def syncs() -> list[tuple[tuple[str, ...], float]]:
            st = self.kv_sync.stats
            kinds = (
                ("replay", st.replays),
                ("snapshot", st.snapshots),
                ("failed", st.failed),
                ("replica", st.replicas),
                ("replica_missing", st.replica_misses),
            )
            return [((k,), n) for k, n in kinds]

        def lookups() -> list[tuple[tuple[str, ...], float]]:
            ls = self.kv_lookup.stats
            return [(("answered",), ls.answered), (("failed",), ls.failed), (("no_replica",), ls.no_replica)]

        reg.collect("interlock_router_kv_syncs_total", syncs)
        reg.collect("interlock_router_kv_sync_bytes_total", lambda: (((), self.kv_sync.stats.bytes),))
        reg.collect(
            "interlock_router_kv_replica_bytes_total", lambda: (((), self.kv_sync.stats.replica_bytes),)
        )
        reg.collect("interlock_router_kv_replica_served_total", lambda: (((), self.kv_replica.served),))
        reg.collect("interlock_router_kv_lookups_total", lookups)
        reg.collect(
            "interlock_router_kv_lookups_served_total", lambda: (((), self.kv_lookup_server.answered),)
        )
        reg.collect("interlock_router_kv_syncing_workers", lambda: (((), self.kv_sync.syncing),))
        reg.collect(
            "interlock_router_weight_prefetches_total",
            lambda: [((k,), n) for k, n in sorted(self.prefetches.items())],
        )

    def _register_router_metrics(self, reg: Registry) -> None:
        per_model: tuple[tuple[str, Callable[[Router], float]], ...] = (
            ("interlock_router_requests_total", lambda r: r.metrics.requests),
            ("interlock_router_prompt_tokens_total", lambda r: r.metrics.prompt_tokens),
            ("interlock_router_predicted_cached_tokens_total", lambda r: r.metrics.predicted_cached_tokens),
            ("interlock_router_rejected_total", lambda r: r.metrics.rejected),
            ("interlock_router_resyncs_total", lambda r: r.metrics.resyncs_requested),
            ("interlock_router_decision_seconds_total", lambda r: r.metrics.decision_s_total),
            ("interlock_router_queue_depth", lambda r: len(r.queue)),
        )
        for name, get in per_model:
            reg.collect(name, partial(self._per_model, get))
        reg.collect(
            "interlock_router_waiting_for_worker",
            lambda: [((m,), float(self._waiting[m])) for m in sorted(self._known_models)],
        )

        def by_model(table: Callable[[Router], dict[str, int]]) -> list[tuple[tuple[str, ...], float]]:
            return [((m, k), n) for m, r in sorted(self.routers.items()) for k, n in sorted(table(r).items())]

        reg.collect("interlock_router_decisions_total", lambda: by_model(lambda r: r.metrics.by_reason))
        reg.collect("interlock_router_queued_total", lambda: by_model(lambda r: r.metrics.queued_by_role))

    def share(self, router: Router) -> None:
        """Queue this router's dispatch events for the other routers (sent every few ms)."""
        events = router.drain_shared()
        if not events or not self._options.share_load:
            return
        self._shared_out += events
        if self._share_timer is None:
            self._share_timer = asyncio.get_running_loop().call_later(SHARE_INTERVAL_S, self._flush_shared)

    def _flush_shared(self) -> None:
        self._share_timer = None
        events, self._shared_out = self._shared_out, []
        if events:
            asyncio.ensure_future(self._publish(subjects.router_load(self.router_id), _encode(events)))

    async def _publish(self, subject: str, payload: bytes) -> None:
        try:
            await self._events.publish(subject, payload)
        except Exception:  # noqa: BLE001 - shared load is advisory
            log.debug("publish to %s failed", subject, exc_info=True)

    # ---- plane listeners ----
    async def _watch(self) -> None:
        watch = self._discovery.watch(subjects.GENERATE_ENDPOINT)
        async with contextlib.aclosing(watch):
            async for ev in watch:
                if ev.kind == "added":
                    self._add(ev.instance)
                else:
                    self._remove(ev.instance.instance_id, graceful=ev.graceful)
                self._changed.set()

    async def _serve_replica(self) -> None:
        self._replica_address = await self._requests.serve(
            KV_REPLICA_ENDPOINT, self.kv_replica.handle, instance_id=self.router_id
        )
        self._lookup_address = await self._requests.serve(
            KV_LOOKUP_ENDPOINT, self.kv_lookup_server.handle, instance_id=self.router_id
        )
        if not self._shard.whole:  # its own shard is asked too, here
            shard = (self._shard.index, self._shard.count)
            self.kv_lookup.local = (self._lookup_address, self.kv_lookup_server, shard)
            self.kv_lookup.add(self.router_id, self._lookup_address, shard)
        await self._discovery.register(
            InstanceInfo(
                instance_id=self._replica_id,
                endpoint=KV_REPLICA_ENDPOINT,
                model="",
                address=self._replica_address,
                metadata={
                    "kind": "router",
                    "kv_lookup_address": self._lookup_address,
                    "kv_shard": self._shard.label,
                },
            )
        )

    async def _watch_replicas(self) -> None:
        watch = self._discovery.watch(KV_REPLICA_ENDPOINT)
        async with contextlib.aclosing(watch):
            async for ev in watch:
                self._on_replica(ev)

    @property
    def _replica_id(self) -> str:
        return REPLICA_ID_PREFIX + self.router_id

    def _on_replica(self, ev: DiscoveryEvent) -> None:
        rid = ev.instance.instance_id
        if rid == self._replica_id or not rid.startswith(REPLICA_ID_PREFIX):
            return  # ourselves, or not a replica (a worker cannot take the prefix)
        lookup = ev.instance.metadata.get("kv_lookup_address", "")
        try:
            shard = parse_shard(ev.instance.metadata.get("kv_shard", ""))
        except ConfigError:
            shard = None  # a replica we cannot place: asked for nothing
        if ev.kind == "added" and ev.instance.address.startswith(ADDRESS_SCHEMES) and shard is not None:
            self._replicas[rid] = ev.instance.address
            self._replica_shards[rid] = shard
            if lookup.startswith(ADDRESS_SCHEMES):
                self.kv_lookup.add(rid, lookup, shard)
        else:
            self._replicas.pop(rid, None)
            self._replica_shards.pop(rid, None)
            self.kv_lookup.remove(rid)

    def _replicas_for(self, instance_id: str) -> list[str]:
        """The other replicas to ask for a worker's state: each worker starts at its own one,
        so a joining frontend's pulls spread over them."""
        peers = sorted(a for rid, a in self._replicas.items() if self._replica_keeps(rid, instance_id))
        if not peers:
            return peers
        first = zlib.crc32(instance_id.encode()) % len(peers)
        return peers[first:] + peers[:first]

    def _replica_keeps(self, router_id: str, instance_id: str) -> bool:
        """Whether replica ``router_id``'s index keeps ``instance_id``'s state."""
        return Shard(*self._replica_shards.get(router_id, (0, 1))).owns(instance_id)

    def _keeps(self, info: InstanceInfo) -> bool:
        """Whether this router ingests ``info``'s KV events and state (an index here, and the
        worker in its shard)."""
        return info.publishes_kv_events and not self._remote and self._shard.owns(info.instance_id)

    async def looked_up(self, router: Router, hashes: list[int]) -> list[int]:
        """``hashes`` with the replicas' lookup where this router keeps no index (``remote``)
        or a shard of it."""
        if not self._asks or not hashes or isinstance(hashes, RemoteChain):
            return hashes
        return await self.kv_lookup.chain(self._model_of(router) or "", hashes)

    def _kv_export(self, instance_id: str) -> tuple[int, dict[str, list[int]]] | None:
        router = self._router_of(instance_id)
        return router.kv_export(instance_id) if router is not None else None

    def _router_for(self, info: InstanceInfo) -> Router:
        router = self.routers.get(info.model)
        if router is None:
            from dataclasses import replace

            cfg = replace(self._config, block_size=info.block_size)
            router = Router(cfg, router_id=self.router_id)
            self.routers[info.model] = router
        return router

    def _add(self, info: InstanceInfo) -> None:
        problem = instance_problem(info)
        if problem is not None:
            log.warning("refused registration of worker %r: %s", info.instance_id[:64], problem)
            return
        held = self._roster.unhold(info.instance_id)
        if held == info:  # heard again, still disagreeing with the model's card
            self._roster.hold(info)
            return
        old = self._instances.get(info.instance_id)
        if old == info:  # heard again after a NATS outage: keep its load and sessions, pull the gap
            router = self.routers.get(info.model)
            if router is not None and self._keeps(info):
                since = router.kv_seq(info.instance_id)
                self.kv_sync.pull(router, info.instance_id, _kv_sync_address(info), since=since)
            return
        if old is not None and old.model != info.model:
            self._remove(info.instance_id)
        if info.role != "prefill" and card_of(info) != self._card_with(info):
            if info.instance_id in self._instances:  # its card changed under it: out of routing
                self._unroute(info.instance_id)
            self._roster.hold(info)
            log.warning(
                "worker %s announces %s but most of model %r's workers announce %s: held out of "
                "routing until most agree (model_card.py)",
                info.instance_id,
                card_of(info),
                info.model,
                self._card_with(info),
            )
            self._update_model(info.model)
            return
        if self._route(info, old):
            self._update_model(info.model)

    def _route(self, info: InstanceInfo, old: InstanceInfo | None = None) -> bool:
        """Put ``info`` in its model's router (replacing ``old``); False if the router refused."""
        try:
            router = self._router_for(info)
            # With no index here (``remote``) or another shard's worker, none of its KV events
            # is heard.
            router.add_worker(
                info if self._keeps(info) else msgspec.structs.replace(info, publishes_kv_events=False)
            )
        except Exception:  # noqa: BLE001 - a misconfigured worker must not stop routing
            log.exception("cannot add worker %s", info.instance_id)
            return False
        if old is not None:  # a new role may leave the old one's waiters without a worker
            self.dispatcher.fail_stranded(router)
        self._roster.route(info)
        log.info("worker %s joined (%s, %s)", info.instance_id, info.model, info.role)
        EVENTS.record("worker_joined", info.instance_id, f"{info.model}, {info.role}")
        if self._keeps(info):
            if not self._shard.whole:
                self._follow_kv(info.instance_id)
            since = router.kv_seq(info.instance_id)
            self.kv_sync.pull(router, info.instance_id, _kv_sync_address(info), since=since)
        return True

    def _remove(self, instance_id: str, *, graceful: bool = False) -> None:
        """Route nothing more to it; ``graceful`` (it unregistered: a drain) lets its streams
        finish where they are, else they break and migrate (``Dispatcher.worker_left``)."""
        info = self._roster.unhold(instance_id) or self._unroute(instance_id, graceful=graceful)
        if info is not None:
            self._update_model(info.model)

    def _unroute(self, instance_id: str, *, graceful: bool = False) -> InstanceInfo | None:
        info = self._roster.unroute(instance_id)
        self.kv_sync.forget(instance_id)
        followed = self._kv_followed.pop(instance_id, None)
        if followed is not None:
            followed.cancel()
        self._reports.pop(instance_id, None)
        if info is None:
            return None
        router = self.routers.get(info.model)
        if router is not None:
            router.remove_worker(instance_id)
            # The last of a role: its waiters fail now (on demand, the pool's wait for the next).
            self.dispatcher.fail_stranded(router, rewait=info.model in self._on_demand)
            if not self._roster.serving(info.model):
                del self.routers[info.model]
            else:
                self.dispatcher.dispatch_queued(router)
        self.dispatcher.worker_left(instance_id, graceful=graceful)
        log.info("worker %s left%s", instance_id, " (draining)" if graceful else "")
        EVENTS.record("worker_left", instance_id, "drained" if graceful else "lost")
        return info

    def _current_card(self, model: str) -> Card | None:
        entry = self._known_models.get(model)
        return Card(entry.model_path, entry.context_length) if entry is not None else None

    def _card_with(self, info: InstanceInfo) -> Card:
        """The model's card were ``info`` one of its live workers."""
        return self._roster.card_with(info, self._current_card(info.model))

    def _update_model(self, model: str) -> None:
        """Re-derive the model's card from its live workers by majority (``model_card``); with
        none, the last card stays (503, not 404). Routed workers the new majority disagrees with
        step aside (their streams finish); held ones it agrees with are routed."""
        card = self._roster.majority(model, self._current_card(model))
        if card is None:
            return
        self._known_models[model] = ModelEntry(model, card.model_path, card.context_length)
        for info in self._roster.routed_off(model, card):
            self._unroute(info.instance_id, graceful=True)
            self._roster.hold(info)
            log.warning(
                "worker %s held out of routing: model %r's card is now %s", info.instance_id, model, card
            )
        for info in self._roster.held_on(model, card):
            self._roster.unhold(info.instance_id)
            self._route(info)

    def _router_of(self, instance_id: str) -> Router | None:
        info = self._instances.get(instance_id)
        return self.routers.get(info.model) if info else None

    async def _ticks(self, interval_s: float = 0.5) -> None:
        while True:
            await asyncio.sleep(interval_s)
            self.dispatcher.tick(
                {wid: self.routers[i.model] for wid, i in self._instances.items() if i.model in self.routers}
            )
            for router in self.routers.values():
                self.kv_sync.tick(router, self._kv_sync_address_of)
                router.tidy()

    async def _health_checks(self, interval_s: float) -> None:
        misses: dict[str, int] = {}
        """Health checks each worker failed in a row."""
        while True:
            await asyncio.sleep(interval_s)
            infos = list(self._instances.values())
            results = await asyncio.gather(
                *(self._requests.ping(i.address, timeout=interval_s) for i in infos),
                return_exceptions=True,
            )
            for wid in misses.keys() - self._instances.keys():  # gone
                del misses[wid]
            for info, result in zip(infos, results, strict=True):
                router = self.routers.get(info.model)
                if router is None:
                    continue
                wid = info.instance_id
                if not isinstance(result, BaseException):
                    misses.pop(wid, None)
                    router.set_health(wid, True)
                    continue
                misses[wid] = missed = misses.get(wid, 0) + 1
                if missed < PING_MISSES:  # one late answer: a loop held a moment, no fault
                    log.info("worker %s answered no health check this time: %s", wid, result)
                    continue
                log.warning("worker %s failed %d health checks in a row: %s", wid, missed, result)
                router.set_health(wid, False)

    async def _from_workers(
        self,
        sub: AsyncIterator[tuple[str, bytes]],
        decode: Callable[[bytes], _FromWorker],
        subject_of: Callable[[str], str],
    ) -> AsyncIterator[tuple[Router, _FromWorker]]:
        """The messages of ``sub`` that decode and came on their own worker's subject (one
        worker speaking for another is forged or confused), with that worker's router.

        A queued burst would otherwise be taken in one turn of the event loop (a queue that
        holds items is read without a pause): every ``TURN_S`` of it, requests get their turn."""
        turn = time.perf_counter()
        async for subject, payload in sub:
            if time.perf_counter() - turn > TURN_S:
                await asyncio.sleep(0)
                turn = time.perf_counter()
            try:
                message = decode(payload)
            except msgspec.DecodeError:
                continue
            if subject != subject_of(message.instance_id):
                continue
            router = self._router_of(message.instance_id)
            if router is not None:
                yield router, message

    def _follow_kv(self, instance_id: str) -> None:
        """A shard's subscription to one of its workers' KV subjects (nats-server sends it no
        other worker's batch). Opened as the worker joins, after its state's pull may have
        begun: a batch missed in between is a gap in the worker's sequence, replayed."""
        if instance_id not in self._kv_followed:
            self._kv_followed[instance_id] = asyncio.create_task(
                self._kv_of(instance_id), name=f"kv-{instance_id[:32]}"
            )

    async def _kv_of(self, instance_id: str) -> None:
        sub = await self._events.subscribe(subjects.kv(instance_id))
        try:
            await self._on_kv(sub)
        finally:
            with contextlib.suppress(Exception):
                await sub.close()

    async def _on_kv(self, sub: AsyncIterator[tuple[str, bytes]]) -> None:
        async for router, batch in self._from_workers(sub, _decode_batch, subjects.kv):
            self.kv_sync.offer(router, self._kv_sync_address_of(batch.instance_id), batch)

    def _kv_sync_address_of(self, instance_id: str) -> str | None:
        info = self._instances.get(instance_id)
        return _kv_sync_address(info) if info is not None else None

    def _ask_snapshot(self, instance_id: str) -> None:
        """A worker with no KV-sync endpoint: ask it to publish its whole cache (the old way)."""
        asyncio.ensure_future(self._publish(subjects.resync(instance_id), b""))

    async def _on_load(self, sub: AsyncIterator[tuple[str, bytes]]) -> None:
        async for router, report in self._from_workers(sub, _decode_load, subjects.load):
            if not self._options.health_check_s:  # else the pings alone decide health
                router.set_health(report.instance_id, True)
            router.apply_load(report)
            self._reports[report.instance_id] = report
            self.dispatcher.dispatch_queued(router)

    async def _on_router_load(self, sub: AsyncIterator[tuple[str, bytes]]) -> None:
        own = subjects.router_load(self.router_id)
        async for subject, payload in sub:
            if subject == own:
                continue  # our own batch, echoed back: not decoded at all
            try:
                decoded = _decode_router_load(payload)
            except msgspec.DecodeError:
                continue
            for ev in decoded if isinstance(decoded, list) else (decoded,):
                if ev.router_id == self.router_id:
                    continue
                router = self._router_of(ev.instance_id)
                if router is not None:
                    router.apply_remote_load(ev)

    # ---- for people ----
    def cluster_view(self) -> dict[str, object]:
        """What the frontend's dashboard draws (``frontend/dashboard.py``): each routed worker
        with its last load report (its weights' return time among it) and its breaker's state,
        and per model the routing decisions by reason, the admission queue's depth and the
        expected cache hit rate."""
        workers = []
        for wid, info in sorted(self._instances.items()):
            r, router = self._reports.get(wid), self.routers.get(info.model)
            workers.append(
                {
                    "id": wid,
                    "model": info.model,
                    "role": info.role,
                    "metadata": dict(info.metadata),
                    "breaker": self.dispatcher.breakers.state(wid).value,
                    "eligible": router is not None and router.is_eligible(wid),
                    "reported": r is not None,
                    "draining": r is not None and r.draining,
                    "num_running": r.num_running if r else 0,
                    "num_waiting": r.num_waiting if r else 0,
                    "kv_blocks_used": r.kv_blocks_used if r else 0,
                    "kv_blocks_total": r.kv_blocks_total if r else info.kv_blocks_total,
                    "weights_out_s": r.weights_load_s if r else 0.0,
                }
            )
        models = {
            m: {
                "decisions": dict(r.metrics.by_reason),
                "queued": len(r.queue),
                "hit_rate": r.metrics.hit_rate,
            }
            for m, r in sorted(self.routers.items())
        }
        return {"workers": workers, "models": models}


def _kv_sync_address(info: InstanceInfo) -> str | None:
    """Where the worker serves KV pulls (``protocol/kv_sync.py``); None: an older worker."""
    return info.metadata.get("kv_sync_address") or None
