"""Clocks: real time for serving, virtual time for simulation.

``realtime`` tells a simulated runner whether to really sleep for a modelled step. A
``VirtualClock`` never sleeps: whoever drives the simulation advances it (``sleep`` on a virtual
clock just advances it, for single-threaded simulations that want that).
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    realtime: bool

    def now(self) -> float:
        """Seconds, monotonic."""
        ...

    def sleep(self, seconds: float) -> None: ...


class RealClock:
    realtime = True

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class VirtualClock:
    realtime = False

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("time does not run backwards")
        self._now += seconds

    def advance_to(self, t: float) -> None:
        self._now = max(self._now, t)

    def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))
