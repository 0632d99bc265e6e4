"""The destination side of a transfer, for the transports that need no thread.

``_Dest`` holds the state machine every destination shares (PENDING -> DONE -> released, or
FAILED, each with its cleanup exactly once) and the progress of a streamed payload: once
claimed, ``payload`` is the whole view and its first ``progress()`` bytes may be read (imported)
while the source still writes the rest; DONE means every byte is there. In-process and
shared-memory pulls need no copy of their own: the payload is the source's own pages
(in-process: the same memoryview; shared memory: the same /dev/shm file mapped here), so the
only copy is the engine's import out of it. Their ``poll`` follows the source's bytes-ready
count and fails the pull when the source aborts, dies or stalls past the timeout.
"""

from __future__ import annotations

import os
import threading
import time

from interlock.protocol.transfer import TransferDescriptor
from interlock.transfer import staging as stg
from interlock.transfer.base import DONE, PENDING, TransferState, TransferStatus, failed
from interlock.transfer.pool import AttachCache
from interlock.transfer.source import LIVENESS_CHECK_S, Source


class _Dest:
    transport = ""

    def __init__(self, descriptor: TransferDescriptor, timeout_s: float) -> None:
        self.transfer_id = descriptor.transfer_id
        self.descriptor = descriptor
        self._lock = threading.Lock()
        self._status = PENDING
        self._payload: memoryview | None = None
        self._ready = 0
        self._released = False
        self._timeout_s = timeout_s
        self._deadline = time.monotonic() + timeout_s
        self.finished_event = threading.Event()
        """Set when the pull is seen to end (DONE or FAILED); for callers that may block."""

    def poll(self) -> TransferStatus:
        return self._status

    def progress(self) -> int:
        """Bytes at the front of ``payload`` that may be read now (all of them on DONE)."""
        return self._ready

    @property
    def payload(self) -> memoryview:
        """The whole payload once claimed (read only its first ``progress()`` bytes while
        PENDING); until ``release`` or a failure."""
        view = self._payload
        if view is None or self._status.state is TransferState.FAILED:
            raise RuntimeError(f"transfer {self.transfer_id} has no payload ({self._status.state.value})")
        return view

    def release(self) -> None:
        with self._lock:
            if self._released or self._status.state is not TransferState.DONE:
                return
            self._released = True
            self._payload = None
        self._on_release()

    def abort(self, reason: str = "aborted by destination") -> None:
        self._fail(reason)

    def _claimed(self, payload: memoryview, ready: int) -> None:
        """The payload is ours to read; its first ``ready`` bytes are there."""
        with self._lock:
            if self._status.finished:
                return
            self._payload = payload
        self._advance(ready)

    def _advance(self, ready: int, *, finish: bool = True) -> None:
        """``ready`` bytes are there (never fewer than before); DONE when that is all of them
        (unless ``finish`` is False: the transport has more to do first)."""
        with self._lock:
            if self._status.finished or ready < self._ready:
                return
            self._ready = ready
            if ready < self.descriptor.nbytes or not finish:
                return
            self._status = DONE
        self.finished_event.set()

    def _overdue(self) -> bool:
        if time.monotonic() <= self._deadline:
            return False
        self._fail(
            f"timeout after {self._timeout_s:g} s with {self._ready} of {self.descriptor.nbytes} bytes"
        )
        return True

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
    """Takes the source's payload view and follows its bytes ready; ``release`` completes the
    source."""

    transport = "inproc"

    def __init__(self, descriptor: TransferDescriptor, source: Source | None, timeout_s: float) -> None:
        super().__init__(descriptor, timeout_s)
        self._source = source
        claim = source.claim("inproc") if source is not None else "unknown transfer (ended or expired)"
        if isinstance(claim, str):
            self._source = None
            self._fail(claim)
        else:
            assert source is not None
            self._claimed(claim, source.ready_nbytes)

    def poll(self) -> TransferStatus:
        source = self._source
        if self._status.finished or source is None:
            return self._status
        status = source.poll()
        if status.state is TransferState.FAILED:
            self._fail(status.reason)
        else:
            self._advance(source.ready_nbytes)
            if not self._status.finished:
                self._overdue()
        return self._status

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
    marks the use claimed in its header; ``poll`` follows the header's bytes-ready word;
    ``release`` marks the use done and the source recycles the buffer."""

    transport = "shm"
    claim = stg.CLAIM_STAGED

    def __init__(self, descriptor: TransferDescriptor, cache: AttachCache, timeout_s: float) -> None:
        super().__init__(descriptor, timeout_s)
        self._cache = cache
        self._staging: stg.Staging | None = None
        self._claimed_use = False
        self._next_liveness = 0.0
        try:
            staging = cache.get(descriptor.shm_name)
        except (OSError, ValueError) as e:
            # A dead source's segment may already be swept by any agent's housekeeping: say why.
            dead = not stg.pid_alive(descriptor.pid)
            self._fail("source process died" if dead else f"shared memory segment unavailable: {e}")
            return
        self._staging = staging
        view = self._claim(staging, descriptor, self.claim)
        if isinstance(view, str):
            self._fail(view)
        else:
            self._claimed_use = True
            self._claimed(view, 0)
            self.poll()

    def poll(self) -> TransferStatus:
        staging = self._staging
        if self._status.finished or staging is None:
            return self._status
        desc = self.descriptor
        ready = staging.ready()  # the count first, then the checks that make it ours
        if not staging.is_use(desc.nbytes, desc.shm_generation):
            self._fail("transfer no longer staged (buffer reused)")
        elif staging.word(stg.W_SRC_STATE) == stg.SRC_ABORTED:
            self._fail("aborted by source")
        elif ready > self._ready or ready == desc.nbytes:
            self._advance(ready)
        elif not self._overdue():
            self._check_source_alive()
        return self._status

    def _check_source_alive(self) -> None:
        """No progress: is the source still there to make some? (A SIGKILLed source writes no
        more; without this its pull would wait for the whole timeout.)"""
        now = time.monotonic()
        if now < self._next_liveness:
            return
        self._next_liveness = now + LIVENESS_CHECK_S
        if not stg.pid_alive(self.descriptor.pid):
            self._fail("source process died")

    @staticmethod
    def _claim(staging: stg.Staging, desc: TransferDescriptor, kind: int) -> memoryview | str:
        view = staging.view_of(desc.nbytes, desc.shm_generation)
        if isinstance(view, str):
            return view
        if staging.word(stg.W_SRC_STATE) == stg.SRC_ABORTED:
            return "aborted by source"
        if staging.word(stg.W_DEST_STATE) != stg.DEST_NONE:
            return "transfer already claimed"
        if not stg.pid_alive(desc.pid):
            # A dead worker's payload is void: the router has given up on it already.
            staging.unlink()
            return "source process died"
        staging.set_word(stg.W_DEST_PID, os.getpid())
        staging.set_word(stg.W_CLAIM, kind)  # before the claim: the source reads them the other way
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
        if self._claimed_use:
            staging.set_word(stg.W_DEST_STATE, dest_state)
        if not self._cache.caching:
            staging.release(unlink=False)


class DirectDest(ShmDest):
    """The one copy: claims the use DIRECT in the staging header, so the source exports nothing
    and holds its blocks; the engine copies them straight from the source's shared cache
    (``descriptor.cache_region``), then asks ``holding()`` (the source has not given them up:
    the copy read what it held) and calls ``release()`` (DONE: the source frees them) or, when
    not holding, ``abort`` and computes the prompt itself. ``payload`` and ``progress`` stay
    empty. A source that dies after the claim fails nothing: its blocks were held until then
    and a mapping made before the death stays readable (``engine.shared_cache``)."""

    transport = "direct"
    claim = stg.CLAIM_DIRECT

    def __init__(
        self, descriptor: TransferDescriptor, cache: AttachCache, timeout_s: float, *, refuse: str = ""
    ) -> None:
        """``refuse``: FAILED at once with this reason, nothing claimed."""
        if descriptor.cache_region is None or not descriptor.shm_name:
            refuse = refuse or "the source offers no shared cache (or no shared-memory header)"
        if not refuse:
            super().__init__(descriptor, cache, timeout_s)
            return
        _Dest.__init__(self, descriptor, timeout_s)
        self._cache, self._staging, self._claimed_use = cache, None, False
        self._fail(refuse)

    def poll(self) -> TransferStatus:
        staging = self._staging
        if self._status.finished or staging is None:
            return self._status
        desc = self.descriptor
        if not staging.is_use(desc.nbytes, desc.shm_generation):
            self._fail("transfer no longer staged (buffer reused)")
        elif staging.word(stg.W_SRC_STATE) == stg.SRC_ABORTED:
            self._fail("aborted by source")
        else:
            self._overdue()
        return self._status

    def holding(self) -> bool:
        """After the copy: the source still holds the blocks, so the copy read them whole."""
        return self.poll().state is TransferState.PENDING

    def release(self) -> None:
        """The copy is in and was ``holding()``: DONE, the source frees its blocks."""
        self._advance(self.descriptor.nbytes)
        super().release()
