"""The source side of a transfer: one staged payload, served once, then freed.

Two ways to fill it: write the whole payload, then ``publish()``; or ``publish(ready=0)`` first
and ``mark_ready(n)`` after each chunk written front to back (streaming: the destination
copies the first chunks out while the source writes the next; ``staging`` has the protocol).

The same object serves whichever transport the destination picks: in-process (hands the payload
view over), shared memory (the destination maps the staging file; the state lives in the file's
header) or TCP (the agent's server sends from the payload). State changes happen under a short
lock from the engine thread (poll/abort) and the agent's threads (claims, completions,
housekeeping); the lock is never held across I/O.

One copy (``publish(cache_region=...)``): a destination on this host that maps the source's
shared KV cache claims the payload DIRECT (``staging``: word 10) and copies the blocks itself;
the owner of the blocks asks ``claim_kind()`` before it exports (nothing to export for a DIRECT
claim) and holds the blocks until this transfer ends.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from interlock.protocol.transfer import SharedCacheRegion, TransferDescriptor
from interlock.transfer import staging as stg
from interlock.transfer.base import DONE, PENDING, TransferState, TransferStatus, failed
from interlock.transfer.pool import SegmentPool

LIVENESS_CHECK_S = 0.05
"""How often a claimed source checks that its shared-memory destination still lives."""


@dataclass(frozen=True, slots=True)
class AgentIdentity:
    agent_id: str
    host_id: str
    pid: int
    tcp_address: str


class Source:
    """A ``SourceTransfer``. Created by ``TransferAgent.create_source``."""

    def __init__(
        self,
        transfer_id: str,
        nbytes: int,
        pool: SegmentPool,
        identity: AgentIdentity,
        timeout_s: float,
        on_finish: Callable[[Source], None],
    ) -> None:
        self.transfer_id = transfer_id
        self._pool = pool
        self._nbytes = nbytes
        self._staging = pool.take(nbytes)
        self._generation = self._staging.prepare(nbytes)
        self._identity = identity
        self._timeout_s = timeout_s
        self._on_finish = on_finish
        self._lock = threading.Lock()
        self._status = PENDING
        self._deadline = time.monotonic() + timeout_s
        self._published = False
        self._claimed_by = ""
        self._final_claim = ""
        """``claim_kind`` as it was when the transfer ended."""
        self._conn: socket.socket | None = None
        self._ready = 0
        self._next_liveness = 0.0
        self._progress = threading.Condition(self._lock)
        """Notified when bytes become ready or the transfer ends (the TCP sender waits on it)."""

    @property
    def nbytes(self) -> int:
        return self._nbytes

    @property
    def buffer(self) -> memoryview:
        """A view of its own: an export still writing when the transfer is aborted (a worker
        closing, a destination gone) writes into pages nobody reads any more, instead of
        failing on the staging's released view ("operation forbidden on released
        memoryview"); a failed transfer's buffer is never recycled."""
        if (self._published and self._ready >= self._nbytes) or self._status.finished:
            raise RuntimeError(f"transfer {self.transfer_id} already complete or ended")
        return self._staging.payload[:]

    @property
    def ready_nbytes(self) -> int:
        return self._ready

    def publish(
        self,
        *,
        ready: int | None = None,
        cache_region: SharedCacheRegion | None = None,
        layout: tuple[int, int, str] | None = None,
    ) -> TransferDescriptor:
        """Serve the payload; its first ``ready`` bytes are written (None: all of them). With
        fewer, write the rest front to back and report it with ``mark_ready``. ``cache_region``:
        the blocks' shared cache, offered for a DIRECT claim (only with a /dev/shm payload:
        the claim lives in its header). ``layout``: the payload's block layout, for the
        destination to check (``TransferDescriptor.layout``)."""
        with self._lock:
            if self._status.finished:
                raise RuntimeError(f"transfer {self.transfer_id} already ended: {self._status.reason}")
            if self._published:
                raise RuntimeError(f"transfer {self.transfer_id} already published")
            self._published = True
            self._deadline = time.monotonic() + self._timeout_s
            self._mark_ready_locked(self._nbytes if ready is None else ready)
        ident = self._identity
        return TransferDescriptor(
            transfer_id=self.transfer_id,
            nbytes=self._nbytes,
            agent_id=ident.agent_id,
            host_id=ident.host_id,
            pid=ident.pid,
            shm_name=self._staging.name,
            shm_generation=self._generation,
            tcp_address=ident.tcp_address,
            expires_at=time.time() + self._timeout_s,
            layout=layout,
            cache_region=cache_region if self._staging.shared else None,
        )

    def mark_ready(self, nbytes: int) -> None:
        """The payload's first ``nbytes`` bytes are written (streaming, after ``publish``)."""
        with self._lock:
            if not self._published:
                raise RuntimeError(f"transfer {self.transfer_id} not published")
            if self._status.finished:
                return  # aborted meanwhile (timeout, destination gone): nobody reads it
            self._mark_ready_locked(nbytes)

    def wait_ready(self, have: int, timeout_s: float) -> int:
        """Block until more than ``have`` bytes are ready, the transfer ends or ``timeout_s``
        passes; returns the bytes ready (the TCP sender's wait)."""
        with self._lock:
            self._progress.wait_for(
                lambda: self._ready > have or self._status.finished, timeout=max(0.0, timeout_s)
            )
            return self._ready

    def claim_kind(self) -> str:
        """ "" while nobody claimed the payload; then "direct" (the destination copies from the
        shared cache: export nothing, hold the blocks until this transfer ends) or "staged"."""
        with self._lock:
            if self._status.finished:
                return self._final_claim  # the staging may serve another transfer by now
            return self._claim_kind_locked()

    def _claim_kind_locked(self) -> str:
        if self._claimed_by:
            return "staged"  # in-process and TCP claims come through ``claim``
        if not self._published or self._staging.word(stg.W_DEST_STATE) == stg.DEST_NONE:
            return ""
        return "direct" if self._staging.word(stg.W_CLAIM) == stg.CLAIM_DIRECT else "staged"

    def remaining_s(self) -> float:
        return self._deadline - time.monotonic()

    def poll(self) -> TransferStatus:
        with self._lock:
            if not self._status.finished:
                self._check_locked()
            return self._status

    def abort(self, reason: str = "aborted by source") -> None:
        with self._lock:
            self._finish_locked(failed(reason))

    # ---- called by transports ----
    def claim(self, transport: str, conn: socket.socket | None = None) -> memoryview | str:
        """Hand the payload to one destination; a reason string when it cannot be had."""
        with self._lock:
            if self._status.finished:
                return self._status.reason or "transfer already completed"
            if not self._published:
                return "transfer not published"
            if self._claimed_by or self._staging.word(stg.W_DEST_STATE) != stg.DEST_NONE:
                return "transfer already claimed"
            self._claimed_by = transport
            self._conn = conn
            # A view of its own: releasing the staging's (recycled, aborted) leaves this one
            # readable until its holder lets it go, instead of "released memoryview" errors.
            return self._staging.payload[:]

    def complete(self) -> None:
        with self._lock:
            self._finish_locked(DONE)

    def fail(self, reason: str) -> None:
        with self._lock:
            self._finish_locked(failed(reason))

    # ---- internals ----
    def _mark_ready_locked(self, nbytes: int) -> None:
        if not self._ready <= nbytes <= self._nbytes:
            raise ValueError(f"bytes ready {nbytes} outside [{self._ready}, {self._nbytes}]")
        self._ready = nbytes
        self._staging.set_ready(nbytes)  # after the bytes (see staging: the publish)
        if nbytes == self._nbytes:
            self._staging.set_word(stg.W_SRC_STATE, stg.SRC_READY)
        self._progress.notify_all()

    def _check_locked(self) -> None:
        dest_state = self._staging.word(stg.W_DEST_STATE) if self._published else stg.DEST_NONE
        if dest_state == stg.DEST_DONE:
            self._finish_locked(DONE)
        elif dest_state == stg.DEST_ABORTED:
            self._finish_locked(failed("aborted by destination"))
        elif dest_state == stg.DEST_CLAIMED and self._destination_died():
            self._finish_locked(failed("destination process died"))
        elif time.monotonic() > self._deadline:
            self._finish_locked(failed(f"timeout after {self._timeout_s:g} s"))

    def _destination_died(self) -> bool:
        """Checked at most every ``LIVENESS_CHECK_S`` (a /proc read; a streamed export polls
        between chunks)."""
        now = time.monotonic()
        if now < self._next_liveness:
            return False
        self._next_liveness = now + LIVENESS_CHECK_S
        return not stg.pid_alive(self._staging.word(stg.W_DEST_PID))

    def _finish_locked(self, status: TransferStatus) -> None:
        if self._status.finished:
            return
        self._final_claim = self._claim_kind_locked()  # before the staging goes back to the pool
        self._status = status
        self._progress.notify_all()
        if status.state is TransferState.FAILED:
            self._staging.set_word(stg.W_SRC_STATE, stg.SRC_ABORTED)
        if self._conn is not None:
            _shutdown(self._conn)
            self._conn = None
        if status.state is TransferState.DONE or not self._published:
            self._pool.give(self._staging)  # nobody else reads it any more: reuse it
        else:
            self._staging.release()  # a destination may still be reading: let it go
        self._on_finish(self)


def _shutdown(sock: socket.socket) -> None:
    """Wake a thread blocked in send/recv on ``sock``; it then closes it."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
