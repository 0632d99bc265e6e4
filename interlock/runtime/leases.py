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

Silence can also be the link between that instance and the control plane, while the instance
itself serves on (a partition between it and NATS; a hung server we have not noticed yet).
So a lease that runs out is not the end by itself: when the table has a ``vouch`` check (the
request plane's ping to the instance's address), the instance is asked directly, and one that
answers keeps its place for another ttl, *unconfirmed* (its events went missing meanwhile) and
counted in ``vouched``. Only an instance that is silent on both planes leaves.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass

from interlock.protocol import InstanceInfo
from interlock.runtime.interfaces import DiscoveryEvent

log = logging.getLogger(__name__)

Vouch = Callable[[InstanceInfo], Awaitable[bool]]
"""Whether an instance whose lease ran out still answers on another plane (never raises)."""


@dataclass(slots=True)
class _Lease:
    info: InstanceInfo
    ttl: float
    timer: asyncio.TimerHandle | None
    """None while the table is suspended."""
    confirmed: bool = True
    """False from ``resume`` (or a vouch) until the instance is heard from again."""
    vouched: bool = False
    """Kept alive by the vouch check since its lease ran out (not heard from since)."""


class _Watcher:
    def __init__(self, endpoint: str | None, owner: object) -> None:
        self.endpoint = endpoint
        self.owner = owner
        self.queue: asyncio.Queue[DiscoveryEvent | None] = asyncio.Queue()

    def offer(self, event: DiscoveryEvent) -> None:
        if self.endpoint is None or event.instance.endpoint == self.endpoint:
            self.queue.put_nowait(event)


class LeaseTable:
    def __init__(self, vouch: Vouch | None = None) -> None:
        self._leases: dict[str, _Lease] = {}
        self._watchers: set[_Watcher] = set()
        self._suspended = False
        self._vouch = vouch
        self._checks: set[asyncio.Task[None]] = set()

    def vouched(self) -> list[str]:
        """Instances silent on discovery but answering the vouch check, sorted."""
        return sorted(i for i, lease in self._leases.items() if lease.vouched)

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
        for check in self._checks:
            check.cancel()
        for lease in self._leases.values():
            _cancel(lease)
        self._leases.clear()
        for watcher in self._watchers:
            watcher.queue.put_nowait(None)

    def _arm(self, instance_id: str, ttl: float) -> asyncio.TimerHandle | None:
        if self._suspended:
            return None
        return asyncio.get_running_loop().call_later(ttl, self._expire, instance_id)

    def _expire(self, instance_id: str) -> None:
        lease = self._leases.get(instance_id)
        if lease is None:
            return
        lease.timer = None
        if self._vouch is None:
            self.remove(instance_id)
            return
        check = asyncio.ensure_future(self._check(instance_id, lease))
        self._checks.add(check)
        check.add_done_callback(self._checks.discard)

    async def _check(self, instance_id: str, lease: _Lease) -> None:
        assert self._vouch is not None
        alive = await self._vouch(lease.info)
        if self._leases.get(instance_id) is not lease or lease.timer is not None:
            return  # heard from, replaced or removed meanwhile
        if not alive:
            self.remove(instance_id)
            return
        if not lease.vouched:
            log.warning(
                "%s: no heartbeat for %.1f s, but it answers on its request plane: kept",
                instance_id,
                lease.ttl,
            )
        lease.vouched, lease.confirmed = True, False
        lease.timer = self._arm(instance_id, lease.ttl)

    def _emit(self, event: DiscoveryEvent) -> None:
        for watcher in self._watchers:
            watcher.offer(event)


def _cancel(lease: _Lease) -> None:
    if lease.timer is not None:
        lease.timer.cancel()
