"""Load deadlines: a copy from a lower tier that does not end in time is abandoned.

Idea: a prefix found below the device pool is only worth loading if it arrives; a disk that
stalls (an NFS hang, a dying device) would otherwise park its request for as long as the read
takes, forever if it hangs. So every load gets a deadline when it is queued: a floor plus its
bytes at a pessimistic read rate (``LoadDeadline``), generous for any working disk. Past it the
engine abandons the load and the request computes the blocks that had not arrived.

The job itself cannot be stopped (it may sit in a read the kernel will not interrupt), so once
abandoned it must never write into the device blocks: the request is computing into them, or
they were freed and reused. ``CopyGuard`` is the handshake between the two threads. The job
reads a block, then copies it into device memory only inside ``guard.copying()``, which refuses
(``Abandoned``) once the load is abandoned; ``abandon`` (engine thread) succeeds only while no
copy runs, and says how many leading blocks arrived before (those are kept). A device copy is a
memory copy, so an abandon that finds one running simply tries again at the next poll. The
count may lag the copies by one block (the job reports after the copy): the request then
computes a block that did arrive, which costs time, never correctness.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LoadDeadline:
    floor_s: float
    min_bytes_per_s: float
    """The slowest read rate still taken for a working disk."""

    def __post_init__(self) -> None:
        if not (self.floor_s > 0 and self.min_bytes_per_s > 0):
            raise ValueError("a load deadline needs a positive floor and read rate")

    def seconds(self, nbytes: int) -> float:
        """How long a load of ``nbytes`` may take, queueing on the I/O thread included."""
        return self.floor_s + nbytes / self.min_bytes_per_s


class Abandoned(Exception):
    """Raised inside a load's job when the engine gave up on it: the copy is skipped."""


class CopyGuard:
    """One load's flags, shared by its job (I/O thread) and the engine thread."""

    __slots__ = ("_lock", "_abandoned", "_copying", "_arrived")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._abandoned = False
        self._copying = False
        self._arrived = 0

    @contextmanager
    def copying(self) -> Iterator[None]:
        """I/O thread: around each copy into device memory; ``Abandoned`` if too late."""
        with self._lock:
            if self._abandoned:
                raise Abandoned
            self._copying = True
        try:
            yield
        finally:
            with self._lock:
                self._copying = False

    def arrived(self, n: int) -> None:
        """I/O thread: the first ``n`` blocks are in their device blocks, intact."""
        with self._lock:
            if not self._abandoned:
                self._arrived = n

    def abandon(self) -> int | None:
        """Engine thread: give up on the load; how many leading blocks arrived, or None if a
        copy is running now (try again later)."""
        with self._lock:
            if self._copying:
                return None
            self._abandoned = True
            return self._arrived

    @property
    def abandoned(self) -> bool:
        with self._lock:
            return self._abandoned
