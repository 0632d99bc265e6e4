"""The seam between the planner and whatever runs workers: a ``Fleet``.

A fleet knows which workers exist (including ones still starting) and carries the planner's
actions out: start a worker of a role, drain and stop one, change one's role. Implementations:
``FakeFleet`` here (tests, and the shape every other one follows); local processes through the
cluster builder; a Kubernetes connector would patch replica counts behind the same calls.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Protocol


@dataclass(frozen=True, slots=True)
class FleetWorker:
    worker_id: str
    role: str
    ready: bool = False
    """Registered and serving (a starting worker is not)."""
    draining: bool = False


@dataclass(frozen=True, slots=True)
class Capacity:
    """What a fleet can still do, as the planner's observation carries it."""

    room: int | None = None
    """More workers its hosts can place (None: no limit known)."""
    reason: str = ""
    """Why (for example ``"host a: 2 of 2 cores used"``)."""
    startup_s: float = 0.0
    """Measured seconds from ``add_worker`` to serving (0: not measured yet)."""


class Fleet(Protocol):
    async def workers(self) -> list[FleetWorker]: ...

    async def capacity(self) -> Capacity:
        """Room for more workers and the measured start-up time."""
        ...

    async def add_worker(self, role: str) -> str:
        """Start a worker of ``role``; returns its id at once (it becomes ready later)."""
        ...

    async def remove_worker(self, worker_id: str, *, drain: bool = True) -> None:
        """``drain``: stop routing to it, let it finish (or migrate) what it holds, then stop
        it; the worker stays listed, draining, until it is gone."""
        ...

    async def set_role(self, worker_id: str, role: str) -> None: ...


class FakeFleet:
    """In-memory fleet: workers start when ``start`` is called (or at once with
    ``instant=True``) and drained ones stop when ``finish_drains`` is called; every call is
    recorded in ``calls``."""

    def __init__(self, roles: dict[str, int] | None = None, *, instant: bool = False) -> None:
        self.instant = instant
        self.room: Capacity = Capacity()
        """What ``capacity`` answers (a test sets it)."""
        self._ids = itertools.count()
        self._workers: dict[str, FleetWorker] = {}
        self.calls: list[tuple[str, str]] = []
        for role, n in (roles or {"both": 1}).items():
            for _ in range(n):
                wid = self._new(role)
                self._workers[wid] = replace(self._workers[wid], ready=True)

    def _new(self, role: str) -> str:
        wid = f"w{next(self._ids)}"
        self._workers[wid] = FleetWorker(wid, role, ready=self.instant)
        return wid

    async def workers(self) -> list[FleetWorker]:
        return list(self._workers.values())

    async def capacity(self) -> Capacity:
        return self.room

    async def add_worker(self, role: str) -> str:
        wid = self._new(role)
        self.calls.append(("add", wid))
        return wid

    async def remove_worker(self, worker_id: str, *, drain: bool = True) -> None:
        self.calls.append(("remove", worker_id))
        w = self._workers[worker_id]
        if drain and w.ready:
            self._workers[worker_id] = replace(w, draining=True)
        else:
            del self._workers[worker_id]

    async def set_role(self, worker_id: str, role: str) -> None:
        self.calls.append(("set_role", f"{worker_id}:{role}"))
        self._workers[worker_id] = replace(self._workers[worker_id], role=role)

    def start(self) -> None:
        """Every starting worker is now ready."""
        for wid, w in self._workers.items():
            self._workers[wid] = replace(w, ready=True)

    def finish_drains(self) -> list[str]:
        """Every draining worker has finished its work and stopped."""
        gone = [wid for wid, w in self._workers.items() if w.draining]
        for wid in gone:
            del self._workers[wid]
        return gone
