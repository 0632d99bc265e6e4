"""Where the KV tiers' copies and file I/O run: off the engine's step loop.

``TierIO.submit(fn)`` queues ``fn`` and returns a ``Job`` the engine thread polls once per step
(``job.done``, never waiting). Jobs run one at a time in submission order, which is what makes
the disk tier simple: a block's write, its later reads and its deletion reach the file system in
the order the engine decided them, with no locks on the index.

``ThreadIO`` runs jobs on one background thread; ``ManualIO`` (the in-package fake) runs them
only when a test calls ``run_pending``, so tests choose every interleaving.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


class Job(Generic[T]):
    """One submitted function; ``result`` is valid once ``done``. An exception is kept as
    ``error`` (the caller decides what a failed copy means)."""

    __slots__ = ("_fn", "_done", "result", "error")

    def __init__(self, fn: Callable[[], T]) -> None:
        self._fn = fn
        self._done = threading.Event()
        self.result: T | None = None
        self.error: BaseException | None = None

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until done (tests, shutdown; never the step loop)."""
        return self._done.wait(timeout)

    def run(self) -> None:
        try:
            self.result = self._fn()
        except BaseException as exc:  # noqa: BLE001 - kept for the poller
            self.error = exc
        finally:
            self._done.set()


class TierIO(Protocol):
    on_done: Callable[[], None] | None
    """Called (on the I/O thread) after each job: the engine's wake-up, so a finished load is
    seen at once instead of at the next idle poll."""

    def submit(self, fn: Callable[[], T]) -> Job[T]: ...

    def close(self, timeout: float | None = None) -> bool:
        """Run what is queued, then stop; False if ``timeout`` passed first (a job is stuck:
        a hung disk must not hang the worker's shutdown too)."""
        ...


class ThreadIO:
    """One daemon thread runs the jobs in order."""

    def __init__(self, name: str = "interlock-kv-tiers") -> None:
        self._queue: queue.SimpleQueue[Job[object] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._closed = False
        self.on_done: Callable[[], None] | None = None
        self._thread.start()

    def submit(self, fn: Callable[[], T]) -> Job[T]:
        job: Job[T] = Job(fn)
        if self._closed:
            job.run()  # after close: run inline so nobody waits forever
            return job
        self._queue.put(job)  # type: ignore[arg-type]
        return job

    def close(self, timeout: float | None = None) -> bool:
        if not self._closed:
            self._closed = True
            self._queue.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            job.run()
            wake = self.on_done
            if wake is not None:
                try:
                    wake()
                except Exception:  # noqa: BLE001 - a wake-up must never stop the I/O thread
                    log.exception("tier I/O wake-up failed")


class ManualIO:
    """The fake: jobs wait until ``run_pending`` (all, or the first ``n``)."""

    def __init__(self) -> None:
        self.pending: deque[Job[object]] = deque()
        self.on_done: Callable[[], None] | None = None

    def submit(self, fn: Callable[[], T]) -> Job[T]:
        job: Job[T] = Job(fn)
        self.pending.append(job)  # type: ignore[arg-type]
        return job

    def run_pending(self, n: int | None = None) -> int:
        count = 0
        while self.pending and (n is None or count < n):
            self.pending.popleft().run()
            count += 1
            if self.on_done is not None:
                self.on_done()
        return count

    def close(self, timeout: float | None = None) -> bool:
        self.run_pending()
        return True
