"""The router's async glue: planes in, decisions out (the frontend's ``Backend``).

No decisions are made here: ``Router`` (one per served model) decides; this shell keeps it fed
(discovery -> workers, event plane -> KV events and load reports, other routers' dispatch
load), asks workers for a snapshot when their event stream has a gap or they (re)join, waits
queued requests out, and streams each request to its worker over the request plane.

A request that fails to reach its worker before any output (worker died, connection refused)
is routed again to another worker, so a killed worker loses no request that it had not started.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import msgspec

from interlock.errors import ModelNotFound, NoWorkers, TransportError
from interlock.protocol import (
    GenerateOutput,
    GenerateRequest,
    InstanceInfo,
    KVEventBatch,
    LoadReport,
    subjects,
)
from interlock.protocol.events import RouterLoadEvent
from interlock.router.admission import Pending, RequestMeta
from interlock.router.decision import Decision
from interlock.router.disagg import DisaggConfig
from interlock.router.disagg_flow import DisaggFlow
from interlock.router.facade import Router, RouterConfig
from interlock.router.indexer import ApplyResult
from interlock.runtime.interfaces import Discovery, EventPlane, RequestPlane

log = logging.getLogger(__name__)

_encode = msgspec.msgpack.Encoder().encode
_decode_output = msgspec.msgpack.Decoder(GenerateOutput).decode
_decode_batch = msgspec.msgpack.Decoder(KVEventBatch).decode
_decode_load = msgspec.msgpack.Decoder(LoadReport).decode
_decode_router_load = msgspec.msgpack.Decoder(list[RouterLoadEvent] | RouterLoadEvent).decode

SHARE_INTERVAL_S = 0.01
"""Dispatch load for other routers leaves in one message per this interval (not one per event:
three NATS messages per request, each echoed back, were a fifth of the frontend's time)."""

EXPLAIN_HEADER = "x-interlock-route"


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What the frontend needs of a served model (mirrors ``frontend.backend.ModelEntry``)."""

    name: str
    model_path: str
    context_length: int


@dataclass(frozen=True)
class ServiceOptions:
    max_attempts: int = 3
    """Workers tried for a request that fails before its first output."""
    queue_timeout_s: float = 30.0
    """How long a queued request waits for a worker before a 503."""
    share_load: bool = True
    """Publish dispatch-time load for other routers, and apply theirs."""
    health_check_s: float | None = None
    """Ping every worker this often; one that does not answer gets no requests until it does
    (None: rely on discovery leases and request failures alone)."""


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
    ) -> None:
        self._discovery = discovery
        self._requests = requests
        self._events = events
        self._config = config or RouterConfig()
        self._options = options
        self.router_id = router_id or uuid.uuid4().hex[:12]
        self.routers: dict[str, Router] = {}
        self._instances: dict[str, InstanceInfo] = {}
        self._waiters: dict[str, asyncio.Future[Decision]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._changed = asyncio.Event()
        self._reports: dict[str, LoadReport] = {}
        self._known_models: dict[str, ModelInfo] = {}
        self._shared_out: list[RouterLoadEvent] = []
        self._share_timer: asyncio.TimerHandle | None = None
        self.disagg = DisaggFlow(self, disagg) if disagg is not None else None
        """Disaggregated prefill/decode (``router.disagg_flow``); None: aggregated only."""

    # ---- lifecycle ----
    async def start(self) -> None:
        kv = await self._events.subscribe(subjects.KV_ALL)
        load = await self._events.subscribe(subjects.LOAD_ALL)
        loops = [self._watch(), self._on_kv(kv), self._on_load(load)]
        if self.disagg is not None:
            loops.append(self.disagg.link_loop())
        if self._options.share_load:
            shared = await self._events.subscribe(subjects.ROUTER_LOAD_ALL)
            loops.append(self._on_router_load(shared))
        if self._options.health_check_s:
            loops.append(self._health_checks(self._options.health_check_s))
        self._tasks = [asyncio.create_task(c) for c in loops]

    async def close(self) -> None:
        if self._share_timer is not None:
            self._share_timer.cancel()
            self._share_timer = None
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks = []
        for fut in self._waiters.values():
            if not fut.done():
                fut.set_exception(NoWorkers("router shutting down"))

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

    # ---- Backend ----
    def models(self) -> list[ModelInfo]:
        """Every model a worker has served since start: one whose workers are all gone stays
        listed, so its requests get 503 + Retry-After (not 404) until a worker comes back."""
        return sorted(self._known_models.values(), key=lambda m: m.name)

    def instances(self) -> list[InstanceInfo]:
        return sorted(self._instances.values(), key=lambda i: i.instance_id)

    async def generate(self, request: GenerateRequest, ctx: object) -> AsyncIterator[GenerateOutput]:
        router = self.routers.get(request.model)
        if router is None:
            if request.model in self._known_models:
                raise NoWorkers(f"no worker is serving '{request.model}' right now", retry_after=1.0)
            raise ModelNotFound(f"The model '{request.model}' does not exist")
        meta = RequestMeta(
            request_id=request.request_id,
            prompt_tokens=len(request.token_ids),
            max_tokens=request.sampling.max_tokens,
            priority=request.priority or int(getattr(ctx, "priority", 0) or 0),
            session_id=getattr(ctx, "session_id", None),
            route_key=getattr(ctx, "route_key", None),
            worker_id=getattr(ctx, "worker_id", None),
        )
        hashes = router.block_hashes(request.token_ids)
        if self.disagg is not None and self.disagg.active(router, request):
            async for out in self.disagg.generate(router, request, meta, hashes):
                yield out
            return
        payload = _encode(request)
        tried: set[str] = set()
        for attempt in range(self._options.max_attempts):
            decision = await self._route(router, meta, hashes)
            if attempt == 0 and getattr(ctx, "explain", False):
                ctx.response_headers[EXPLAIN_HEADER] = decision.header()  # type: ignore[attr-defined]
            if log.isEnabledFor(logging.DEBUG):  # the line lists every candidate: build it only if shown
                log.debug(decision.log_line())
            self._share(router)
            tried.add(decision.worker_id)
            started = False
            try:
                async for out in self._stream(router, decision, payload):
                    started = True
                    yield out
                return
            except TransportError as exc:
                if started or attempt + 1 == self._options.max_attempts:
                    raise
                log.warning("worker %s failed before output (%s): routing %s again",
                            decision.worker_id, exc.message, request.request_id)
                router.set_health(decision.worker_id, False)
            finally:
                self._finish(router, request.request_id)
        raise NoWorkers("no worker could take the request")  # pragma: no cover

    def prometheus_text(self) -> str:
        """Workers' last load reports and the routers' counters, in Prometheus text format."""
        lines: list[str] = []
        per_worker = (
            ("kv_blocks_used", "KV blocks in use (last report)", lambda r: r.kv_blocks_used),
            ("kv_blocks_total", "KV blocks in the pool", lambda r: r.kv_blocks_total),
            ("running_requests", "Requests running (last report)", lambda r: r.num_running),
            ("waiting_requests", "Requests waiting (last report)", lambda r: r.num_waiting),
        )
        for name, help_, get in per_worker:
            lines += [f"# HELP interlock_worker_{name} {help_}", f"# TYPE interlock_worker_{name} gauge"]
            for wid, r in sorted(self._reports.items()):
                model = self._instances[wid].model if wid in self._instances else ""
                lines.append(f'interlock_worker_{name}{{worker="{wid}",model="{model}"}} {get(r)}')
        counters = (
            ("decisions_total", "Routing decisions", lambda m: m.decisions),
            ("prompt_tokens_total", "Prompt tokens routed", lambda m: m.prompt_tokens),
            ("predicted_cached_tokens_total", "Prompt tokens expected from cache where routed",
             lambda m: m.predicted_cached_tokens),
            ("queued_total", "Requests that waited for a free worker", lambda m: m.queued),
            ("rejected_total", "Requests rejected with 503 (queue full)", lambda m: m.rejected),
            ("resyncs_total", "KV index re-syncs requested", lambda m: m.resyncs_requested),
            ("decision_seconds_total", "Time spent deciding", lambda m: m.decision_s_total),
        )
        for name, help_, get in counters:
            lines += [f"# HELP interlock_router_{name} {help_}", f"# TYPE interlock_router_{name} counter"]
            for model, router in sorted(self.routers.items()):
                lines.append(f'interlock_router_{name}{{model="{model}"}} {get(router.metrics)}')
        if self.disagg is not None:
            lines += self.disagg.prometheus_lines()
        return "\n".join(lines) + "\n"

    # ---- per request ----
    async def _route(self, router: Router, meta: RequestMeta, hashes: list[int]) -> Decision:
        d = router.route(meta, block_hashes=hashes)
        if isinstance(d, Pending):
            fut: asyncio.Future[Decision] = asyncio.get_running_loop().create_future()
            self._waiters[meta.request_id] = fut
            try:
                return await asyncio.wait_for(fut, self._options.queue_timeout_s)
            except TimeoutError:
                router.cancel(meta.request_id)
                raise NoWorkers("timed out waiting for a free worker", retry_after=1.0) from None
            finally:
                self._waiters.pop(meta.request_id, None)
        return d

    async def _stream(self, router: Router, d: Decision, payload: bytes) -> AsyncIterator[GenerateOutput]:
        info = self._instances.get(d.worker_id)
        if info is None:
            raise TransportError(f"worker {d.worker_id} left")
        first = True
        stream = self._requests.stream(info.address, payload)
        async with contextlib.aclosing(stream):
            async for chunk in stream:
                out = _decode_output(chunk)
                if first and (out.token_ids or out.finished):
                    first = False
                    router.on_first_token(d.request_id)
                    self._share(router)
                yield out
                if out.finished:
                    return

    def _finish(self, router: Router, request_id: str) -> None:
        router.cancel(request_id)
        self._share(router)
        self._dispatch(router)

    def _dispatch(self, router: Router) -> None:
        for d in router.dispatch_queued():
            fut = self._waiters.get(d.request_id)
            if fut is not None and not fut.done():
                fut.set_result(d)
            else:
                router.on_finish(d.request_id)

    def _share(self, router: Router) -> None:
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
                    self._remove(ev.instance.instance_id)
                self._changed.set()

    def _router_for(self, info: InstanceInfo) -> Router:
        router = self.routers.get(info.model)
        if router is None:
            from dataclasses import replace

            cfg = replace(self._config, block_size=info.block_size)
            router = Router(cfg, router_id=self.router_id)
            self.routers[info.model] = router
        return router

    def _add(self, info: InstanceInfo) -> None:
        old = self._instances.get(info.instance_id)
        if old is not None and old.model != info.model:
            self._remove(info.instance_id)
        try:
            self._router_for(info).add_worker(info)
        except Exception:  # noqa: BLE001 - a misconfigured worker must not stop routing
            log.exception("cannot add worker %s", info.instance_id)
            return
        self._instances[info.instance_id] = info
        if info.role != "prefill":
            self._known_models[info.model] = ModelInfo(info.model, info.model_path, info.context_length)
        log.info("worker %s joined (%s, %s)", info.instance_id, info.model, info.role)
        if info.publishes_kv_events:
            asyncio.ensure_future(self._publish(subjects.resync(info.instance_id), b""))

    def _remove(self, instance_id: str) -> None:
        info = self._instances.pop(instance_id, None)
        self._reports.pop(instance_id, None)
        if info is None:
            return
        router = self.routers.get(info.model)
        if router is not None:
            router.remove_worker(instance_id)
            if not router.workers():
                del self.routers[info.model]
            else:
                self._dispatch(router)
        log.info("worker %s left", instance_id)

    def _router_of(self, instance_id: str) -> Router | None:
        info = self._instances.get(instance_id)
        return self.routers.get(info.model) if info else None

    async def _health_checks(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            infos = list(self._instances.values())
            results = await asyncio.gather(
                *(self._requests.ping(i.address, timeout=interval_s) for i in infos),
                return_exceptions=True,
            )
            for info, result in zip(infos, results, strict=True):
                router = self.routers.get(info.model)
                if router is not None:
                    healthy = not isinstance(result, BaseException)
                    if not healthy:
                        log.warning("worker %s failed its health check: %s", info.instance_id, result)
                    router.set_health(info.instance_id, healthy)

    async def _on_kv(self, sub: AsyncIterator[tuple[str, bytes]]) -> None:
        async for _subject, payload in sub:
            try:
                batch = _decode_batch(payload)
            except msgspec.DecodeError:
                continue
            router = self._router_of(batch.instance_id)
            if router is None:
                continue
            if router.apply_events(batch) is ApplyResult.GAP:
                await self._publish(subjects.resync(batch.instance_id), b"")

    async def _on_load(self, sub: AsyncIterator[tuple[str, bytes]]) -> None:
        async for _subject, payload in sub:
            try:
                report = _decode_load(payload)
            except msgspec.DecodeError:
                continue
            router = self._router_of(report.instance_id)
            if router is None:
                continue
            if not self._options.health_check_s:  # else the pings alone decide health
                router.set_health(report.instance_id, True)
            router.apply_load(report)
            self._reports[report.instance_id] = report
            self._dispatch(router)

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
