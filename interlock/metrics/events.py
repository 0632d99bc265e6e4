"""The cluster's recent events, for people: a worker joined or left, a request migrated, a
process restarted, the planner decided. A bounded ring (the oldest entry goes first), read by
the frontend's dashboard; nothing here is durable or exported, the logs and ``/metrics`` stay
the record.

One process-wide log, ``EVENTS``, so the component that sees an event records it with one line
and no wiring (``interlock serve`` runs router, supervisor and planner in the frontend's
process). Recording costs an append; the kinds are plain words (``worker_joined``,
``worker_left``, ``migration``, ``restart``, ``planner``)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

CAPACITY = 200


@dataclass(frozen=True, slots=True)
class Event:
    time: float
    """Wall-clock seconds since the epoch."""
    kind: str
    subject: str
    """What it happened to: a worker's id, a request's id, a process's name, a model."""
    reason: str


class EventLog:
    """The last ``capacity`` events, oldest first."""

    def __init__(self, capacity: int = CAPACITY, clock: Callable[[], float] = time.time) -> None:
        self._ring: deque[Event] = deque(maxlen=capacity)
        self._clock = clock

    def record(self, kind: str, subject: str, reason: str = "") -> Event:
        event = Event(self._clock(), kind, subject, reason)
        self._ring.append(event)
        return event

    def recent(self, limit: int | None = None) -> list[Event]:
        """The newest ``limit`` events (all kept: None), oldest first."""
        events = list(self._ring)
        return events if limit is None else events[max(0, len(events) - limit) :]

    def __len__(self) -> int:
        return len(self._ring)


EVENTS = EventLog()
"""This process's events."""
