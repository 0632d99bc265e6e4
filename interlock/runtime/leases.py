"""A table of live instances with lease deadlines, fanning changes out to watchers.

Both discovery implementations feed one of these: in-process, the shared registry holds it;
over NATS, each process keeps its own, fed by heartbeat announcements. Expiry is a timer per
instance, re-armed by each heartbeat, so a silent instance leaves exactly ``ttl`` seconds after
its last heartbeat (no polling loop, no clock skew between hosts: only local time is used).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from interlock.protocol import InstanceInfo
from interlock.runtime.interfaces import DiscoveryEvent


@dataclass(slots=True)
class _Lease:
    info: InstanceInfo
    timer: asyncio.TimerHandle


class _Watcher:
    def __init__(self, endpoint: str | None, owner: object) -> None:
        self.endpoint = endpoint
        self.owner = owner
        self.queue: asyncio.Queue[DiscoveryEvent | None] = asyncio.Queue()

    def offer(self, event: DiscoveryEvent) -> None:
        if self.endpoint is None or event.instance.endpoint == self.endpoint:
            self.queue.put_nowait(event)


class LeaseTable:
    def __init__(self) -> None:
        self._leases: dict[str, _Lease] = {}
        self._watchers: set[_Watcher] = set()

    def refresh(self, info: InstanceInfo, ttl: float) -> None:
        """Add or renew ``info``'s lease for ``ttl`` seconds from now."""
        timer = asyncio.get_running_loop().call_later(ttl, self.remove, info.instance_id)
        old = self._leases.get(info.instance_id)
        self._leases[info.instance_id] = _Lease(info, timer)
        if old is not None:
            old.timer.cancel()
            if old.info == info:
                return
            # Changed registration (new address after a restart): watchers see it replaced.
            self._emit(DiscoveryEvent("removed", old.info))
        self._emit(DiscoveryEvent("added", info))

    def remove(self, instance_id: str) -> None:
        lease = self._leases.pop(instance_id, None)
        if lease is not None:
            lease.timer.cancel()
            self._emit(DiscoveryEvent("removed", lease.info))

    def instances(self, endpoint: str) -> list[InstanceInfo]:
        found = [lease.info for lease in self._leases.values() if lease.info.endpoint == endpoint]
        return sorted(found, key=lambda info: info.instance_id)

    async def watch(self, endpoint: str | None, owner: object = None) -> AsyncGenerator[DiscoveryEvent, None]:
        """Yield the current instances as ``added``, then changes, until the table closes or
        ``end_watches(owner)`` is called."""
        watcher = _Watcher(endpoint, owner)
        # Snapshot and subscription happen in one synchronous step, so no change falls between.
        for lease in sorted(self._leases.values(), key=lambda lease: lease.info.instance_id):
            watcher.offer(DiscoveryEvent("added", lease.info))
        self._watchers.add(watcher)
        try:
            while (event := await watcher.queue.get()) is not None:
                yield event
        finally:
            self._watchers.discard(watcher)

    def end_watches(self, owner: object) -> None:
        for watcher in self._watchers:
            if watcher.owner is owner:
                watcher.queue.put_nowait(None)

    def close(self) -> None:
        """Cancel every timer and end every watch (without ``removed`` events)."""
        for lease in self._leases.values():
            lease.timer.cancel()
        self._leases.clear()
        for watcher in self._watchers:
            watcher.queue.put_nowait(None)

    def _emit(self, event: DiscoveryEvent) -> None:
        for watcher in self._watchers:
            watcher.offer(event)
