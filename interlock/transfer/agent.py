"""One transfer agent per worker process: creates sources, starts pulls, picks the transport.

The transport is chosen by the destination from the descriptor alone: the source's agent lives
in this process -> in-process; the source's host and /dev/shm namespace are ours and it staged
in /dev/shm -> shared memory; otherwise TCP. Sources always stage in /dev/shm when it is
usable, so one staged payload can be served by any of the three.

A DIRECT pull (``pull_direct``, the one copy from a source's shared KV cache) is the engine's
choice, made before ``pull`` when it can map the source's cache (``engine.disagg``); it needs the
same host and the staging header in /dev/shm, and is refused under a forced transport.

The agent's server thread also does housekeeping every ``tick_s``: it polls every live source
(so timeouts and dead destinations free buffers even if the engine stops polling) and, every
``sweep_s``, unlinks /dev/shm payloads of processes that died.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
import weakref
from pathlib import Path

from interlock.errors import TransferError
from interlock.protocol.handshake import is_loopback
from interlock.protocol.transfer import TransferDescriptor
from interlock.transfer import staging as stg
from interlock.transfer.base import DEFAULT_TIMEOUT_S, TRANSPORTS, DestTransfer
from interlock.transfer.dest import DirectDest, InprocDest, ShmDest
from interlock.transfer.pool import AttachCache, RecvPool, SegmentPool
from interlock.transfer.source import AgentIdentity, Source
from interlock.transfer.tcp import TcpDest, TcpServer

log = logging.getLogger(__name__)

_AGENTS: weakref.WeakValueDictionary[str, TransferAgent] = weakref.WeakValueDictionary()
"""Live agents of this process, by id: how an in-process pull finds its source."""


def host_id() -> str:
    """Equal on two processes exactly when they share a kernel and a /dev/shm mount."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = socket.gethostname()
    try:
        st = os.stat(stg.SHM_DIR)
        shm = f"{st.st_dev}:{st.st_ino}"
    except OSError:
        shm = "noshm"
    return f"{boot}/{shm}"


class TransferAgent:
    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        advertise_host: str | None = None,
        use_shm: bool = True,
        pool_bytes: int = 1 << 30,
        tick_s: float = 0.2,
        sweep_s: float = 10.0,
        cluster_secret: bytes | None = None,
        transport: str | None = None,
    ) -> None:
        """``cluster_secret``: TCP peers (pulls, link checks) must pass the handshake on it
        (``protocol.handshake``); None: anyone who reaches the port may pull a staged payload.
        ``transport``: every pull uses this one (a deployment's ``cache_transport``) instead of
        choosing per descriptor; a pull it cannot make fails at once."""
        if transport is not None and transport not in TRANSPORTS:
            raise ValueError(f"unknown transport {transport!r}")
        self.transport = transport
        self.agent_id = uuid.uuid4().hex
        self.host_id = host_id()
        self._use_shm = use_shm and stg.shm_available()
        self._segments = SegmentPool(pool_bytes, shared=self._use_shm)
        self._recv_buffers = RecvPool(pool_bytes)
        self._attached = AttachCache(pool_bytes)
        self._sources: dict[str, Source] = {}
        self._lock = threading.Lock()
        self._sweep_s = sweep_s
        self._next_sweep = 0.0
        self._closed = False
        self.cluster_secret = cluster_secret
        self._housekeep()
        if cluster_secret is None and not is_loopback(host):
            log.warning(
                "KV transfer agent listens on %s without a cluster secret: anyone who "
                "reaches it can pull staged KV (set INTERLOCK_CLUSTER_SECRET)",
                host,
            )
        self._server = TcpServer(
            host=host,
            port=port,
            advertise_host=advertise_host or host,
            lookup=self._lookup,
            probe=self._probe,
            tick=self._housekeep,
            tick_s=tick_s,
            secret=cluster_secret,
        )
        self._identity = AgentIdentity(self.agent_id, self.host_id, os.getpid(), self._server.address)
        _AGENTS[self.agent_id] = self

    @property
    def tcp_address(self) -> str:
        return self._server.address

    def create_source(
        self, nbytes: int, *, timeout_s: float = DEFAULT_TIMEOUT_S, transfer_id: str | None = None
    ) -> Source:
        """A staged payload of ``nbytes`` to fill through ``.buffer``, then ``.publish()``."""
        if nbytes < 0:
            raise ValueError("nbytes must be >= 0")
        if self._closed:
            raise TransferError("transfer agent is closed")
        tid = transfer_id or uuid.uuid4().hex
        self._reap()  # a finished source's buffer goes back to the pool before we take one
        if self._lookup(tid) is not None:
            raise TransferError(f"duplicate transfer id {tid}")
        try:
            source = Source(tid, nbytes, self._segments, self._identity, timeout_s, self._forget)
        except OSError as e:
            raise TransferError(f"cannot stage {nbytes} bytes: {e}") from e
        with self._lock:
            self._sources[tid] = source
        return source

    def choose_transport(self, descriptor: TransferDescriptor) -> str:
        if descriptor.agent_id in _AGENTS:
            return "inproc"
        if descriptor.shm_name and descriptor.host_id == self.host_id:
            return "shm"
        if descriptor.tcp_address:
            return "tcp"
        raise TransferError(f"no transport reaches transfer {descriptor.transfer_id}")

    def pull(
        self,
        descriptor: TransferDescriptor,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        transport: str | None = None,
    ) -> DestTransfer:
        """Start pulling; returns at once. ``transport`` forces one (tests, link checks)."""
        kind = transport or self.transport or self.choose_transport(descriptor)
        if kind not in TRANSPORTS:
            raise ValueError(f"unknown transport {kind!r}")
        if kind == "inproc":
            agent = _AGENTS.get(descriptor.agent_id)
            source = agent._lookup(descriptor.transfer_id) if agent else None
            return InprocDest(descriptor, source, timeout_s)
        if kind == "shm":
            return ShmDest(descriptor, self._attached, timeout_s)
        return TcpDest(descriptor, timeout_s, self._recv_buffers, self.cluster_secret)

    def pull_direct(
        self, descriptor: TransferDescriptor, *, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> DirectDest:
        """Claim the transfer DIRECT (the one copy from the source's shared cache, which the
        caller has mapped already); FAILED at once when it cannot be claimed so (another host,
        no shared cache, a forced transport): the caller then pulls it staged, or computes."""
        if self.transport is not None or descriptor.host_id != self.host_id:
            why = f"forced transport {self.transport}" if self.transport else "source on another host"
            return DirectDest(descriptor, self._attached, timeout_s, refuse=why)
        return DirectDest(descriptor, self._attached, timeout_s)

    def num_live_sources(self) -> int:
        with self._lock:
            return len(self._sources)

    def close(self) -> None:
        """Abort every live source and stop the server. Idempotent."""
        if self._closed:
            return
        self._closed = True
        _AGENTS.pop(self.agent_id, None)
        with self._lock:
            sources = list(self._sources.values())
        for source in sources:
            source.abort("transfer agent closed")
        self._server.close()
        self._segments.close()
        self._recv_buffers.close()
        self._attached.close()

    def __enter__(self) -> TransferAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- internals ----
    def _lookup(self, transfer_id: str) -> Source | None:
        with self._lock:
            return self._sources.get(transfer_id)

    def _forget(self, source: Source) -> None:
        with self._lock:
            self._sources.pop(source.transfer_id, None)

    def _probe(self, nbytes: int, timeout_s: float) -> TransferDescriptor:
        # Filler stays as the kernel zeroed it: a link check measures the link, not an export.
        return self.create_source(nbytes, timeout_s=timeout_s).publish()

    def _reap(self) -> None:
        """Poll every live source: ended ones (their destination said DONE, or they timed out)
        free or recycle their buffers now."""
        with self._lock:
            sources = list(self._sources.values())
        for source in sources:
            source.poll()

    def _housekeep(self) -> None:
        self._reap()
        self._attached.prune()
        now = time.monotonic()
        if self._use_shm and now >= self._next_sweep:
            self._next_sweep = now + self._sweep_s
            stg.sweep_orphans()
