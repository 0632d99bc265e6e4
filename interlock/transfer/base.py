"""The KV-transfer interface: start, poll, abort, on both sides, never blocking the caller.

A transfer moves one contiguous payload (N blocks x ``kv_block_nbytes``) from a source worker
to a destination worker. The destination *pulls*:

* source: ``agent.create_source(nbytes)`` -> ``SourceTransfer``; the engine exports the blocks
  into ``src.buffer`` and calls ``src.publish()`` -> ``TransferDescriptor``, then polls once per
  step (or not at all: the agent's housekeeping ends it on time either way). Streaming: it
  publishes first (``publish(ready=0)``), then exports front to back, ``mark_ready`` after each
  chunk, so the destination copies while the source still exports (``kv.publish_blocks``).
* destination: ``agent.pull(descriptor)`` -> ``DestTransfer``; polled once per step; the first
  ``progress()`` bytes of ``dst.payload`` may be imported as they come (``kv.BlockImport``); on
  DONE every byte is there; the engine imports the rest and calls ``dst.release()``.

Every transfer ends in exactly one terminal state on each side, DONE or FAILED (with a reason),
and every buffer is freed when it does: after an abort on either side, a timeout, or a peer that
died, the other side reaches FAILED within a bounded time (the timeout at worst).

Threading: I/O runs on the agent's background threads; ``poll``/``abort``/``release`` only read
or flip state under a short lock and return at once.
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass
from typing import Protocol

from interlock.names import KV_TRANSPORTS
from interlock.protocol.transfer import SharedCacheRegion, TransferDescriptor

DEFAULT_TIMEOUT_S = 30.0
"""How long a source keeps a published payload, and a destination waits for one."""

TRANSPORTS = KV_TRANSPORTS


class TransferState(enum.Enum):
    PENDING = "pending"
    DONE = "done"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class TransferStatus:
    state: TransferState
    reason: str = ""
    """Why it FAILED (empty otherwise)."""

    @property
    def finished(self) -> bool:
        return self.state is not TransferState.PENDING


PENDING = TransferStatus(TransferState.PENDING)
DONE = TransferStatus(TransferState.DONE)


def failed(reason: str) -> TransferStatus:
    return TransferStatus(TransferState.FAILED, reason)


class SourceTransfer(Protocol):
    transfer_id: str

    @property
    def buffer(self) -> memoryview:
        """Writable payload to export the blocks into, until it is complete."""
        ...

    def publish(
        self, *, ready: int | None = None, cache_region: SharedCacheRegion | None = None
    ) -> TransferDescriptor:
        """Serve the payload until a destination has it or the timeout; its first ``ready``
        bytes are written (None: all of them; otherwise ``mark_ready`` the rest as written).
        ``cache_region``: offer the one copy from this shared cache (``DirectDest``)."""
        ...

    def claim_kind(self) -> str:
        """ "" until claimed; "direct" (export nothing, hold the blocks until the transfer
        ends) or "staged" (export into ``buffer``)."""
        ...

    def mark_ready(self, nbytes: int) -> None:
        """The payload's first ``nbytes`` bytes are written (never fewer than before)."""
        ...

    def poll(self) -> TransferStatus: ...

    def abort(self, reason: str = "aborted by source") -> None: ...


class DestTransfer(Protocol):
    transfer_id: str
    transport: str
    """"inproc", "shm", "tcp" or "direct" (``DirectDest``: no payload, the one copy)."""
    finished_event: threading.Event
    """Set once the pull is seen to end (DONE or FAILED), for callers that may block (link
    checks, tests); the engine polls. A TCP pull's thread sets it; an in-process or shared
    memory pull of a payload still being written is seen to end by ``poll``."""

    def poll(self) -> TransferStatus: ...

    def progress(self) -> int:
        """Bytes at the front of ``payload`` that may be read now, as of the last ``poll``
        (all of them on DONE)."""
        ...

    @property
    def payload(self) -> memoryview:
        """The payload, from the claim until ``release``: its first ``progress()`` bytes are
        valid (all of them after DONE)."""
        ...

    def release(self) -> None:
        """The payload is imported: free it and tell the source (DONE). Idempotent."""
        ...

    def abort(self, reason: str = "aborted by destination") -> None: ...
