"""A worker: one engine behind the runtime planes.

The engine is anything that serves the seam (``engine.serving.ServingEngine``): Interlock's
own (an ``EngineCore`` given here is run by an ``AsyncEngine``), vLLM's, or the fake. The
worker announces which in ``InstanceInfo.metadata["engine"]``; a KV hand-off for
disaggregation exists only for Interlock's engine (``engine.disagg``). A worker whose engine
reports a problem (``ServingEngine.problem``: a dead engine process) leaves discovery, ends its
streams (they migrate) and sets ``dead``; its process then exits for a supervisor to restart.

The worker is a thin shell (no decisions): it registers an ``InstanceInfo`` in discovery, serves
``generate`` on the request plane (msgpack ``GenerateRequest`` in, one msgpack
``GenerateOutput`` per chunk out), publishes the engine's KV events (numbered batches) and load
reports on the event plane, keeps its last batches in a ring for a router that missed some and
serves them, or its whole cache, on the request plane (``engine.kv_sync``; a router of an older
kind asks on the event plane and gets its cache published there), and drains on
shutdown: unregister first so routers stop sending, refuse new calls, let in-flight requests
finish within a grace period, abort the rest. Routers see the unregister as a graceful leave
(not a death) and let those streams finish here; only the aborted ones migrate.

Subject names come from ``interlock.protocol.subjects``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import msgspec

from interlock.engine.async_engine import AsyncEngine
from interlock.engine.control import WorkerControl
from interlock.engine.core import EngineCore
from interlock.engine.disagg import KVHandoff
from interlock.engine.kv_sync import KvEventLog, KvSyncServer
from interlock.engine.pacing import LOAD_INTERVAL_S, ReportPacer
from interlock.engine.serving import ServingEngine
from interlock.engine.worker_metrics import WorkerMetrics
from interlock.errors import InvalidRequest
from interlock.logctx import REQUEST_ID
from interlock.metrics import CONTENT_TYPE, tracing
from interlock.metrics.http import serve_http
from interlock.protocol import (
    InstanceInfo,
    KVEvent,
    KVEventBatch,
    LoadReport,
    packed_ids,
    subjects,
)
from interlock.protocol.control import CONTROL_ENDPOINT
from interlock.protocol.generate import decode_request
from interlock.protocol.kv_sync import KV_SYNC_ENDPOINT
from interlock.runtime.interfaces import CallContext, Discovery, EventPlane, RequestPlane
from interlock.transfer import TransferAgent

log = logging.getLogger(__name__)
access_log = logging.getLogger("interlock.worker.access")
"""One DEBUG line per request served: its id, finish reason, tokens and times (DEBUG: under
``serve`` a worker's lines pass through the frontend's process; the frontend's own access line,
at INFO, names the worker already)."""


@dataclass(frozen=True)
class WorkerOptions:
    load_interval_s: float = LOAD_INTERVAL_S
    """Most frequent load report (``engine/pacing.py``: one made sooner waits for the interval's
    end, a newer one replacing it); an idle worker reports every ``idle_report_s``."""
    idle_report_s: float = 1.0
    drain_grace_s: float = 30.0
    """How long a draining worker lets its requests finish before it aborts them."""
    kv_transfer_timeout_s: float = 30.0
    """Disaggregation: how long a staged KV payload waits to be pulled, and a pull to finish."""
    health_interval_s: float = 0.5
    """How often the engine's ``problem()`` is checked."""
    metrics_port: int | None = 0
    """Serve this worker's own ``/metrics`` on this port (0: any free one; None: not at all),
    announced as ``metadata["metrics_address"]`` (docs/metrics.md)."""
    metrics_host: str | None = None
    """The address to serve metrics on (None: the request plane's host, else 127.0.0.1)."""


_encode = msgspec.msgpack.Encoder().encode


class Worker:
    def __init__(
        self,
        engine: EngineCore | ServingEngine,
        info: InstanceInfo,
        *,
        discovery: Discovery,
        requests: RequestPlane,
        events: EventPlane,
        options: WorkerOptions = WorkerOptions(),
        transfer: TransferAgent | None = None,
    ) -> None:
        if isinstance(engine, EngineCore):
            engine = AsyncEngine(engine, sink=self)
        self.engine: ServingEngine = engine
        self.handoff = (
            KVHandoff(engine, transfer, timeout_s=options.kv_transfer_timeout_s)
            if transfer is not None and isinstance(engine, AsyncEngine)
            else None
        )
        """Disaggregation: stages prefill KV and pulls remote KV (None: no transfer agent)."""
        self._control_address = ""
        self.info = info
        self._discovery = discovery
        self._requests = requests
        self._events = events
        self._options = options
        self._seq = 0
        self.kv_log = KvEventLog()
        """The batches published last, for a router that missed some (``engine/kv_sync.py``)."""
        self.kv_sync = KvSyncServer(self.engine, self.kv_log)
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._outbox: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self._address = ""
        self._pacer: ReportPacer[LoadReport] = ReportPacer(options.load_interval_s)
        self._draining = False
        self.dead = asyncio.Event()
        """Set when the engine can no longer serve (``problem``); the worker has left."""
        self.problem: str | None = None
        self._last_report: LoadReport | None = None
        stats = getattr(self.engine, "engine_stats", None)
        self.metrics = WorkerMetrics(
            stats=stats,
            load=lambda: self._last_report,
            handoff=lambda: self.handoff.counters if self.handoff is not None else None,
            block_size=info.block_size,
        )
        self._metrics_server: asyncio.Server | None = None

    @property
    def instance_id(self) -> str:
        return self.info.instance_id

    # ---- lifecycle ----
    async def start(self) -> InstanceInfo:
        self.engine.start(self)
        self._address = await self._requests.serve(
            self.info.endpoint, self._handle, instance_id=self.instance_id
        )
        self.info = msgspec.structs.replace(self.info, address=self._address)
        await self._serve_endpoints()
        resync = await self._events.subscribe(subjects.resync(self.instance_id))
        self._tasks = [
            asyncio.create_task(self._publisher(), name="worker-publisher"),
            asyncio.create_task(self._resync_loop(resync), name="worker-resync"),
            asyncio.create_task(self._health_loop(), name="worker-health"),
        ]
        await self._discovery.register(self.info)
        log.info("worker %s serving %s at %s", self.instance_id, self.info.model, self._address)
        return self.info

    async def drain(self, grace_s: float | None = None) -> None:
        """Leave discovery, refuse new calls, finish in-flight requests (abort after grace)."""
        if self._draining:
            return
        self._draining = True
        grace = self._options.drain_grace_s if grace_s is None else grace_s
        await self._discovery.unregister(self.instance_id)
        await self._requests.unserve(self._address)
        try:
            await asyncio.wait_for(self._idle.wait(), grace)
        except TimeoutError:
            log.warning("drain grace of %.1fs over: aborting %d requests", grace, self._in_flight)
        await self.close()

    async def close(self) -> None:
        if self.handoff is not None:
            await self.handoff.close()
        if self._control_address:
            await self._requests.unserve(self._control_address)
        await self.engine.shutdown()
        for task in self._tasks:
            # Cancel until done: Python 3.11's wait_for swallows a cancel that lands as its
            # inner get() completes (the publisher would then run forever).
            while not task.done():
                task.cancel()
                await asyncio.wait([task], timeout=0.1)
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        await self._requests.unserve(self._address)
        if self._metrics_server is not None:
            self._metrics_server.close()
            await self._metrics_server.wait_closed()
            self._metrics_server = None

    # ---- request plane ----
    async def _handle(self, payload: bytes, ctx: CallContext) -> AsyncIterator[bytes]:
        try:
            req = decode_request(payload)
        except msgspec.DecodeError as exc:  # a peer's bug, not this worker's: say so, serve on
            raise InvalidRequest(f"malformed generate request: {exc}") from None
        span = tracing.start_span("worker.generate", parent=req.traceparent)
        if span.is_recording():  # the engine's and the KV transfer's spans go under this one
            span.set_attributes({"worker_id": self.instance_id, "request_id": req.request_id})
            req = msgspec.structs.replace(req, traceparent=tracing.traceparent(span))
        self._in_flight += 1
        self._idle.clear()
        figures = self.metrics.request()
        finished = False
        logged = REQUEST_ID.set(req.request_id)  # this worker's lines about it say so
        try:
            stream = self.handoff.generate(req) if self.handoff is not None else self.engine.generate(req)
            async with contextlib.aclosing(stream):
                async for out in stream:
                    figures.output(out)
                    finished = out.finish_reason is not None
                    yield _encode(out)
        finally:
            figures.closed(finished)
            if span.is_recording():
                span.set_attributes(figures.span_attributes(finished))
                span.end()
            if access_log.isEnabledFor(logging.DEBUG):
                access_log.debug("%s %s", req.request_id, figures.line(finished))
            with contextlib.suppress(ValueError):  # closed from another context: nothing to undo
                REQUEST_ID.reset(logged)
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()

    # ---- control (role change, pool check, link check) ----
    @property
    def in_flight(self) -> int:
        return self._in_flight

    async def _serve_endpoints(self) -> None:
        """The control and KV-sync endpoints, their addresses announced in the metadata."""
        self._control_address = await self._requests.serve(
            CONTROL_ENDPOINT, WorkerControl(self).handle, instance_id=self.instance_id
        )
        kv_sync_address = await self._requests.serve(
            KV_SYNC_ENDPOINT, self.kv_sync.handle, instance_id=self.instance_id
        )
        meta = dict(
            self.info.metadata,
            control_address=self._control_address,
            kv_sync_address=kv_sync_address,
            engine=self.engine.name,
        )
        meta.update(self.engine.announce())
        meta.setdefault(*packed_ids.ANNOUNCED)  # it reads prompt ids packed (decode_request)
        if self._options.metrics_port is not None:
            host = self._options.metrics_host or _host_of(self._address)
            self._metrics_server = await serve_http(
                {"/metrics": lambda: (CONTENT_TYPE, self.metrics.render().encode())},
                host,
                self._options.metrics_port,
            )
            port = self._metrics_server.sockets[0].getsockname()[1]
            meta["metrics_address"] = f"{host}:{port}"
        if self.handoff is not None:
            meta["kv_transfer_address"] = self.handoff.agent.tcp_address
            meta["kv_block_nbytes"] = str(self.handoff.engine.core.runner.kv_block_nbytes)
        self.info = msgspec.structs.replace(self.info, metadata=meta)

    async def set_role(self, role: str, *, grace_s: float = 30.0) -> None:
        """Leave discovery, finish what is in flight (abort after ``grace_s``), come back as
        ``role``. Routers see the worker leave and re-join with the new role."""
        if role == self.info.role or self._draining:
            return
        await self._discovery.unregister(self.instance_id)
        try:
            await asyncio.wait_for(self._idle.wait(), grace_s)
        except TimeoutError:
            log.warning("role change: %d requests still running after %.1fs", self._in_flight, grace_s)
        self.info = msgspec.structs.replace(self.info, role=role)
        await self._discovery.register(self.info)
        log.info("worker %s now serves as %s", self.instance_id, role)

    # ---- event plane ----
    def publish_kv(self, events: list[KVEvent], *, snapshot: bool = False) -> None:
        batch = KVEventBatch(
            instance_id=self.instance_id,
            seq=self._seq,
            timestamp=time.time(),
            events=tuple(events),
            snapshot=snapshot,
        )
        self._seq += 1
        payload = _encode(batch)
        self.kv_log.append(batch.seq, payload)
        self._outbox.put_nowait((subjects.kv(self.instance_id), payload))

    def publish_load(self, load: LoadReport, *, force: bool = False) -> None:
        """Send ``load`` to the routers, paced (``ReportPacer``); ``force``: at once."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        if force:
            self._pacer.sent(now)
            self._send_load(load)
            return
        send, wake_at = self._pacer.offer(load, now)
        if send is not None:
            self._send_load(send)
        if wake_at is not None:
            loop.call_at(wake_at, self._send_held_load)

    def _send_held_load(self) -> None:
        due = self._pacer.due(asyncio.get_running_loop().time())
        if due is not None:
            report, held_s = due
            self._send_load(msgspec.structs.replace(report, held_s=held_s))

    def _send_load(self, load: LoadReport) -> None:
        if self._draining:
            load = msgspec.structs.replace(load, draining=True)
        load = msgspec.structs.replace(load, instance_id=self.instance_id)
        self._outbox.put_nowait((subjects.load(self.instance_id), _encode(load)))

    async def publish_snapshot(self) -> None:
        """Publish the whole cache as one ``snapshot`` batch, in order with the step events
        (taken on the engine thread between steps; earlier steps' events are queued first)."""
        events = await self.engine.kv_snapshot()
        self.publish_kv(events, snapshot=True)

    # KVEventSink: the async engine calls these on this event loop after each step.
    def on_kv_events(self, events: list[KVEvent]) -> None:
        if events:
            self.publish_kv(events)

    def on_load(self, load: LoadReport) -> None:
        self._last_report = load
        self.publish_load(load)

    async def _publisher(self) -> None:
        while True:
            try:
                subject, payload = await asyncio.wait_for(self._outbox.get(), self._options.idle_report_s)
            except TimeoutError:
                self.publish_load(self.engine.load(), force=True)
                continue
            try:
                await self._events.publish(subject, payload)
            except Exception:  # noqa: BLE001 - a lost event is recovered by re-sync
                log.warning("event publish failed on %s", subject, exc_info=True)

    async def _health_loop(self) -> None:
        while (problem := self.engine.problem()) is None:
            await asyncio.sleep(self._options.health_interval_s)
        log.error("worker %s: the engine cannot serve (%s): leaving", self.instance_id, problem)
        self.problem = problem
        # Not a drain: the streams cannot finish here, so routers see a death and migrate them.
        self._draining = True
        with contextlib.suppress(Exception):
            await self._requests.unserve(self._address)
        with contextlib.suppress(Exception):
            await self._discovery.unregister(self.instance_id)
        self.dead.set()

    async def _resync_loop(self, subscription: AsyncIterator[tuple[str, bytes]]) -> None:
        async for _subject, _payload in subscription:
            await self.publish_snapshot()


def _host_of(address: str) -> str:
    """The host of a ``tcp://host:port`` request-plane address; 127.0.0.1 for any other."""
    if address.startswith("tcp://"):
        host = address[len("tcp://") :].rsplit(":", 1)[0].strip("[]")
        if host and host not in ("0.0.0.0", "::"):
            return host
    return "127.0.0.1"
