"""The destination side of a transfer, for the transports that need no thread.

``_Dest`` holds the state machine every destination shares (PENDING -> DONE -> released, or
FAILED, each with its cleanup exactly once). In-process and shared-memory pulls finish at start:
the payload is the source's own pages (in-process: the same memoryview; shared memory: the same
/dev/shm file mapped here), so the only copy is the engine's ``import_blocks`` out of it.
"""

from __future__ import annotations

import os
import threading

from interlock.protocol.transfer import TransferDescriptor
from interlock.transfer import staging as stg
from interlock.transfer.base import DONE, PENDING, TransferState, TransferStatus, failed
from interlock.transfer.pool import AttachCache
from interlock.transfer.source import Source


class _Dest:
    transport = ""

    def __init__(self, descriptor: TransferDescriptor) -> None:
        self.transfer_id = descriptor.transfer_id
        self.descriptor = descriptor
        self._lock = threading.Lock()
        self._status = PENDING
        self._payload: memoryview | None = None
        self._released = False
        self.finished_event = threading.Event()
        """Set on DONE or FAILED; for callers that may block (link checks, tests)."""

    def poll(self) -> TransferStatus:
        return self._status

    @property
    def payload(self) -> memoryview:
        if self._status.state is not TransferState.DONE or self._payload is None:
            raise RuntimeError(f"transfer {self.transfer_id} has no payload ({self._status.state.value})")
        return self._payload

    def release(self) -> None:
        with self._lock:
            if self._released or self._status.state is not TransferState.DONE:
                return
            self._released = True
            self._payload = None
        self._on_release()

    def abort(self, reason: str = "aborted by destination") -> None:
        self._fail(reason)

    def _succeed(self, payload: memoryview) -> None:
        with self._lock:
            if self._status.finished:
                return
            self._payload = payload
            self._status = DONE
        self.finished_event.set()

    def _fail(self, reason: str) -> bool:
        """FAILED unless already failed or released; True when this call ended it. A DONE
        payload not yet released can still be given up (the request went away meanwhile)."""
        with self._lock:
            if self._released or self._status.state is TransferState.FAILED:
                return False
            self._status = failed(reason)
            self._payload = None
        self._on_fail(reason)
        self.finished_event.set()
        return True

    def _on_release(self) -> None:
        pass

    def _on_fail(self, reason: str) -> None:
        pass


class InprocDest(_Dest):
    """Takes the source's payload view; ``release`` completes the source."""

    transport = "inproc"

    def __init__(self, descriptor: TransferDescriptor, source: Source | None) -> None:
        super().__init__(descriptor)
        self._source = source
        claim = source.claim("inproc") if source is not None else "unknown transfer (ended or expired)"
        if isinstance(claim, str):
            self._source = None
            self._fail(claim)
        else:
            self._succeed(claim)

    def _on_release(self) -> None:
        if self._source is not None:
            self._source.complete()
            self._source = None

    def _on_fail(self, reason: str) -> None:
        if self._source is not None:
            self._source.fail(reason)
            self._source = None


class ShmDest(_Dest):
    """Maps the source's /dev/shm staging file (through the agent's cache of mappings) and
    marks the use claimed in its header; ``release`` marks it done and the source recycles it."""

    transport = "shm"

    def __init__(self, descriptor: TransferDescriptor, cache: AttachCache) -> None:
        super().__init__(descriptor)
        self._cache = cache
        self._staging: stg.Staging | None = None
        self._claimed = False
        try:
            staging = cache.get(descriptor.shm_name)
        except (OSError, ValueError) as e:
            self._fail(f"shared memory segment unavailable: {e}")
            return
        self._staging = staging
        view = self._claim(staging, descriptor)
        if isinstance(view, str):
            self._fail(view)
        else:
            self._claimed = True
            self._succeed(view)

    @staticmethod
    def _claim(staging: stg.Staging, desc: TransferDescriptor) -> memoryview | str:
        view = staging.view_of(desc.nbytes, desc.shm_generation)
        if isinstance(view, str):
            return view
        if staging.word(stg.W_SRC_STATE) != stg.SRC_READY:
            return "aborted by source"
        if staging.word(stg.W_DEST_STATE) != stg.DEST_NONE:
            return "transfer already claimed"
        if not stg.pid_alive(desc.pid):
            # A dead worker's payload is void: the router has given up on it already.
            staging.unlink()
            return "source process died"
        staging.set_word(stg.W_DEST_PID, os.getpid())
        staging.set_word(stg.W_DEST_STATE, stg.DEST_CLAIMED)
        return view

    def _on_release(self) -> None:
        self._drop(stg.DEST_DONE)

    def _on_fail(self, reason: str) -> None:
        self._drop(stg.DEST_ABORTED)

    def _drop(self, dest_state: int) -> None:
        staging, self._staging = self._staging, None
        if staging is None:
            return
        if self._claimed:
            staging.set_word(stg.W_DEST_STATE, dest_state)
        if not self._cache.caching:
            staging.release(unlink=False)
