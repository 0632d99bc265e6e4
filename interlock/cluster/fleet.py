"""The planner's ``Fleet`` over the workers this deployment runs (``RunningCluster``): the
live connector's hands. No decisions here: it lists the workers, starts one, drains one,
re-roles one, exactly as the planner asked.

A worker is *ready* once it is registered with the router (a starting child is not); the
time from its launch to then is measured by ``RunningCluster`` (which sees every launch, the
Python API's included) and reported, smoothed, in ``capacity().startup_s``, beside the room
its host has left. A removal
drains in the background (the worker leaves discovery, finishes what it has within the drain
grace, then stops) and the worker stays listed, draining, until it has stopped, so the planner
neither counts it as capacity nor decides again before the fleet has settled.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any, Protocol

from interlock.errors import ConfigError
from interlock.planner.fleet import Capacity, FleetWorker

log = logging.getLogger(__name__)


class Handle(Protocol):
    """One running worker, as ``cluster.builder.WorkerHandle`` describes it."""

    @property
    def instance_id(self) -> str: ...

    @property
    def role(self) -> str: ...

    @property
    def group(self) -> int: ...


class Workers(Protocol):
    """The running deployment's calls this fleet makes (``cluster.builder.RunningCluster``)."""

    service: Any
    """The router service (None before it starts): a worker is ready once it knows it."""

    def workers(self) -> Sequence[Handle]: ...

    async def add_worker(self, role: str, group: int) -> Handle: ...

    async def remove_worker(self, handle: Any, *, drain: bool) -> None: ...

    async def set_role(self, handle: Any, role: str, *, grace_s: float) -> None: ...

    async def room(self, group: int) -> tuple[int, str]:
        """More workers of ``group`` its host can take, and what binds (``planner.placement``)."""
        ...

    def startup_s(self, group: int) -> float:
        """Measured seconds from launch to serving of ``group``'s workers (0: none yet)."""
        ...


class ClusterFleet:
    def __init__(self, running: Workers, group: int = 0, *, role_grace_s: float = 30.0) -> None:
        self.running = running
        self.group = group
        self.role_grace_s = role_grace_s
        self._draining: dict[str, tuple[Handle, asyncio.Task[None]]] = {}

    def _ready(self, instance_id: str) -> bool:
        service = self.running.service
        return service is not None and service.instance(instance_id) is not None

    async def workers(self) -> list[FleetWorker]:
        for wid, (_, task) in list(self._draining.items()):
            if task.done():
                del self._draining[wid]
                if not task.cancelled() and task.exception() is not None:
                    log.error("planner: stopping worker %s failed: %r", wid, task.exception())
        out = [
            FleetWorker(h.instance_id, h.role, ready=self._ready(h.instance_id))
            for h in self.running.workers()
            if h.group == self.group
        ]
        out += [
            FleetWorker(h.instance_id, h.role, ready=True, draining=True) for h, _ in self._draining.values()
        ]
        return out

    async def capacity(self) -> Capacity:
        """Room on the hosts for another worker of this group (its cores, devices and memory
        against theirs, less headroom), and how long one took to serve lately."""
        n, why = await self.running.room(self.group)
        return Capacity(n, why, self.running.startup_s(self.group))

    def _handle(self, worker_id: str) -> Handle:
        for h in self.running.workers():
            if h.instance_id == worker_id and h.group == self.group:
                return h
        raise ConfigError(f"worker {worker_id!r} is not one of this deployment's running workers")

    async def add_worker(self, role: str) -> str:
        handle = await self.running.add_worker(role, self.group)
        return handle.instance_id

    async def remove_worker(self, worker_id: str, *, drain: bool = True) -> None:
        handle = self._handle(worker_id)
        if not drain:
            await self.running.remove_worker(handle, drain=False)
            return
        task = asyncio.create_task(self.running.remove_worker(handle, drain=True), name=f"drain-{worker_id}")
        self._draining[worker_id] = (handle, task)

    async def set_role(self, worker_id: str, role: str) -> None:
        await self.running.set_role(self._handle(worker_id), role, grace_s=self.role_grace_s)

    async def close(self) -> None:
        """Wait for the drains under way (``RunningCluster.close`` stops the rest)."""
        tasks = [t for _, t in self._draining.values()]
        self._draining.clear()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
