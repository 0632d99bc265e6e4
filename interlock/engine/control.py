"""A worker's control calls (``interlock.protocol.control``): role change, pool check, link check,
weights brought back (the router's prefetch).

Served on the request plane next to ``generate``, at ``metadata["control_address"]`` of the
worker's ``InstanceInfo``. Each call answers with one ``ControlReply``; a failure is a reply
with ``ok=False``, never a broken stream.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Protocol

import msgspec

from interlock.engine.disagg import KVHandoff
from interlock.engine.serving import ServingEngine
from interlock.names import ROLES
from interlock.protocol import InstanceInfo
from interlock.protocol.control import ControlReply, ControlRequest
from interlock.runtime.interfaces import CallContext
from interlock.transfer import measure_link


class ControlTarget(Protocol):
    """What the control endpoint reads and drives of its worker (``engine.worker.Worker``)."""

    info: InstanceInfo
    engine: ServingEngine
    handoff: KVHandoff | None

    @property
    def in_flight(self) -> int: ...

    async def set_role(self, role: str, *, grace_s: float = 30.0) -> None: ...


log = logging.getLogger(__name__)

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(ControlRequest).decode


class WorkerControl:
    def __init__(self, worker: ControlTarget) -> None:
        self.worker = worker

    async def handle(self, payload: bytes, ctx: CallContext) -> AsyncIterator[bytes]:
        try:
            reply = await self._dispatch(_decode(payload))
        except Exception as exc:  # noqa: BLE001 - answered, not raised
            log.warning("control call failed", exc_info=True)
            reply = ControlReply(ok=False, error=f"{type(exc).__name__}: {exc}")
        yield _encode(reply)

    async def _dispatch(self, req: ControlRequest) -> ControlReply:
        w = self.worker
        if req.op == "set_role":
            if req.role not in ROLES:
                return ControlReply(ok=False, error=f"unknown role {req.role!r}")
            await w.set_role(req.role, grace_s=req.grace_s)
            return await self._status()
        if req.op in ("status", "check_integrity"):
            return await self._status()
        if req.op == "measure_link":
            return await self._measure(req.peer_address)
        if req.op == "load_weights":
            return ControlReply(ok=True, role=w.info.role, weights_load_s=await w.engine.load_weights())
        return ControlReply(ok=False, error=f"unknown op {req.op!r}")

    async def _status(self) -> ControlReply:
        w = self.worker
        used, total, err = await w.engine.pool_status()
        live, transports = 0, dict(w.engine.handoff_counts())
        if w.handoff is not None:
            live = w.handoff.num_pending() + w.handoff.agent.num_live_sources()
            transports = dict(w.handoff.counters.transports)
        return ControlReply(
            ok=not err,
            role=w.info.role,
            kv_blocks_used=used,
            kv_blocks_total=total,
            in_flight=w.in_flight,
            integrity_error=err,
            live_transfers=live,
            pulls_by_transport=transports,
        )

    async def _measure(self, peer: str) -> ControlReply:
        handoff = self.worker.handoff
        if handoff is None:
            return ControlReply(ok=False, error="this worker has no transfer agent")
        # Small probe: a few MiB tells the bandwidth without stealing the link for long.
        stats = await asyncio.to_thread(
            measure_link, handoff.agent, peer, num_blocks=4, repeats=3, pings=5, timeout_s=10.0
        )
        return ControlReply(
            ok=True,
            role=self.worker.info.role,
            transport=stats.transport,
            bandwidth_bytes_per_s=stats.bandwidth_bytes_per_s,
            rtt_s=stats.rtt_s,
        )
