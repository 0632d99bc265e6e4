"""When a worker's load reports leave for the routers: at most one per interval.

An engine makes a load report after every step (a few milliseconds each on a busy worker), and
every router applies every report it gets: without a limit the routers' work grows with the
fleet's step rate, not with its requests. So a report leaves at once if the last one left at
least ``interval_s`` ago; one made sooner is held (a newer one replaces it) and leaves when the
interval ends. Routers then hear a busy worker ``1 / interval_s`` times a second, and always
hear its latest state within ``interval_s`` (dropping the held report instead would leave a
worker that just went idle looking busy until its next idle report).

The real worker (``engine/worker.py``, on its event loop's clock) and the replay's simulated
workers (``sim/worker.py``, on virtual time) both pace with this, so the router in a replay
hears what it would hear in a deployment. Pure: the caller owns the clock and the timer.
"""

from __future__ import annotations

import math
from typing import Generic, TypeVar

LOAD_INTERVAL_S = 0.05
"""A worker's shortest time between two load reports (``WorkerOptions.load_interval_s``)."""

R = TypeVar("R")


class ReportPacer(Generic[R]):
    __slots__ = ("interval_s", "_last", "_held", "_made", "_timer")

    def __init__(self, interval_s: float = LOAD_INTERVAL_S) -> None:
        if not interval_s >= 0:
            raise ValueError(f"a load report interval must be >= 0 seconds, got {interval_s}")
        self.interval_s = interval_s
        self._last = -math.inf
        self._held: R | None = None
        self._made = 0.0
        self._timer = False

    @property
    def last(self) -> float:
        """When the last report left (-inf: none yet)."""
        return self._last

    @property
    def timer_at(self) -> float | None:
        """When the ``due`` call asked for is to come, or None when none is pending."""
        return self._last + self.interval_s if self._timer else None

    def offer(self, report: R, now: float) -> tuple[R | None, float | None]:
        """``report`` was made at ``now``: returns ``(to send now or None, when to call
        ``due``)``, the second only when no call is pending yet (one timer per interval)."""
        if now - self._last >= self.interval_s:
            self._last = now
            self._held = None
            return report, None
        self._held = report
        self._made = now
        return None, self.arm()

    def arm(self) -> float | None:
        """Ask for the ``due`` call at the interval's end, ahead of the report it will send (a
        caller that knows one will be held); None if one is pending already."""
        if self._timer:
            return None
        self._timer = True
        return self._last + self.interval_s

    def due(self, now: float) -> tuple[R, float] | None:
        """The interval ended at ``now``: the held report to send, if one is still held, and
        how long it was held (the receiver's view of the worker is that much older)."""
        self._timer = False
        held, self._held = self._held, None
        if held is None:
            return None
        self._last = now
        return held, now - self._made

    def sent(self, now: float) -> None:
        """A report left outside the pacer at ``now`` (an idle worker's periodic one): the held
        one, older, is dropped and the interval starts again."""
        self._last = now
        self._held = None
