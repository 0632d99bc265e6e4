"""A table of live instances with lease deadlines, fanning changes out to watchers.

Both discovery implementations feed one of these: in-process, the shared registry holds it;
over NATS, each process keeps its own, fed by heartbeat announcements. Expiry is a timer per
instance, re-armed by each heartbeat, so a silent instance leaves exactly ``ttl`` seconds after
its last heartbeat (no polling loop, no clock skew between hosts: only local time is used).

Silence can be ours rather than theirs: while this process is cut off from the heartbeats
(NATS down), ``suspend`` stops every timer so nothing expires for want of messages we could not
receive. ``resume`` re-arms each lease for a full ttl and marks it *unconfirmed*: the next
announcement for it reaches watchers as ``added`` even if nothing changed, because whatever
watchers derived from the instance (a router's KV index, fed by events) went stale while we
were away. An instance never heard from again expires ``ttl`` after ``resume``.
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
    ttl: float
    timer: asyncio.TimerHandle | None
    """None while the table is suspended."""
    confirmed: bool = True
    """False from ``resume`` until the instance is heard from again."""


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
        self._suspended = False

    @property
    def suspended(self) -> bool:
        return self._suspended

    def refresh(self, info: InstanceInfo, ttl: float) -> None:
        """Add or renew ``info``'s lease for ``ttl`` seconds from now (from ``resume`` if
        suspended). Watchers see ``added`` if it is new, changed or unconfirmed."""
        old = self._leases.get(info.instance_id)
        self._leases[info.instance_id] = _Lease(info, ttl, self._arm(info.instance_id, ttl))
        if old is not None:
            _cancel(old)
            if old.info == info:
                if not old.confirmed:  # heard again after our outage: watchers re-sync
                    self._emit(DiscoveryEvent("added", info))
                return
            # Changed registration (new address after a restart): watchers see it replaced.
            self._emit(DiscoveryEvent("removed", old.info))
        self._emit(DiscoveryEvent("added", info))

    def remove(self, instance_id: str, *, graceful: bool = False) -> None:
        """Drop the instance; ``graceful``: it unregistered itself (else its lease ran out)."""
        lease = self._leases.pop(instance_id, None)
        if lease is not None:
            _cancel(lease)
            self._emit(DiscoveryEvent("removed", lease.info, graceful=graceful))

    def suspend(self) -> None:
        """Stop expiring: we cannot hear heartbeats now, so their absence proves nothing."""
        self._suspended = True
        for lease in self._leases.values():
            _cancel(lease)
            lease.timer = None

    def resume(self) -> None:
        """Give every lease a full ttl from now and mark it unconfirmed (see the module note)."""
        self._suspended = False
        for instance_id, lease in self._leases.items():
            _cancel(lease)
            lease.timer = self._arm(instance_id, lease.ttl)
            lease.confirmed = False

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
            _cancel(lease)
        self._leases.clear()
        for watcher in self._watchers:
            watcher.queue.put_nowait(None)

    def _arm(self, instance_id: str, ttl: float) -> asyncio.TimerHandle | None:
        if self._suspended:
            return None
        return asyncio.get_running_loop().call_later(ttl, self.remove, instance_id)

    def _emit(self, event: DiscoveryEvent) -> None:
        for watcher in self._watchers:
            watcher.offer(event)


def _cancel(lease: _Lease) -> None:
    if lease.timer is not None:
        lease.timer.cancel()
