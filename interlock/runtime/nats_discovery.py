"""Discovery over core NATS: heartbeat announcements plus a start-up query.

Chosen over a JetStream KV bucket with TTL because it needs no JetStream (any nats-server,
no storage), because a removal must reach watchers as an event (KV expiry by max-age leaves
no delete marker for watchers on the servers we ship), and because each instance can carry its
own lease timeout. How it works:

* A registered instance publishes ``Announcement(info, ttl)`` on
  ``interlock.discovery.announce.<instance_id>`` every ``heartbeat_interval``; on ``unregister``
  it publishes its id on ``interlock.discovery.bye.<instance_id>`` (watchers see a ``graceful``
  removal: it is draining, not dead). The id is in the subject so that nats-server can confine
  each worker's login to its own subjects (``nats_permissions``); an announcement or bye whose
  payload names another instance than its subject is dropped.
* A process that reads the table keeps a ``LeaseTable`` fed by those subjects: an announcement
  (re)arms the instance's expiry timer for ``ttl`` seconds, so a killed process leaves every
  table ``ttl`` seconds after its last heartbeat.
* Only such a process subscribes to the announcements: the table starts on the first
  ``instances()``, ``watch()`` or ``start()`` (a frontend looks before its router starts, so it
  knows every live worker before it serves). A process that only registers (a worker)
  subscribes to the query alone: N workers cost N messages per heartbeat interval, not N².
* A newcomer does not wait a heartbeat to learn who is alive: when its table starts it publishes
  a query, every registrar re-announces its instances at once (on their own subjects, never on
  a reply inbox, where the subject could not vouch for the payload), and the start waits
  ``discovery_sync_s`` for them.
* Core NATS delivers at most once, and nats-server was seen to drop ~2% of the first messages
  sent to a subscription made a moment before (even after a flush). Heartbeats repair a missed
  announcement within one interval, and the start-up query is sent twice.
* The server restarting (or the link dropping) is our silence, not theirs: while disconnected
  the table's expiry is suspended and no heartbeats are sent (buffered ones would be stale). On
  reconnect every lease gets a fresh ttl, our own instances are announced at once and (once the
  table has started) the start-up query is sent again; each instance heard from again then
  reaches watchers as a new ``added``, even if unchanged, because what they derived from
  events (a router's KV index) missed whatever was published in the outage. Instances not heard
  from expire a ttl later.
  "Disconnected" includes a server that stopped answering on an open socket (``probe_link``).
* A lease that runs out is checked on the request plane before the instance is dropped
  (``LeaseTable``'s vouch): an instance cut off from NATS that still serves keeps serving.
* An announcement's ttl must be finite and within ``MIN_TTL_S``..``MAX_TTL_S``: a worker may
  not make itself immortal or vanish-and-return at will (it is dropped and logged).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncGenerator

import msgspec
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription as NatsSubscription
from nats.errors import Error as NatsError
from nats.errors import OutboundBufferLimitError

from interlock.protocol import InstanceInfo
from interlock.runtime.config import MAX_TTL_S, MIN_TTL_S, RuntimeConfig
from interlock.runtime.interfaces import DiscoveryEvent
from interlock.runtime.leases import LeaseTable, Vouch
from interlock.runtime.naming import SUBJECT_PREFIX, EndpointName, check_token

ANNOUNCE = f"{SUBJECT_PREFIX}.discovery.announce"
"""``ANNOUNCE.<instance_id>``: that instance's announcements."""
BYE = f"{SUBJECT_PREFIX}.discovery.bye"
"""``BYE.<instance_id>``: that instance unregistered."""
QUERY = f"{SUBJECT_PREFIX}.discovery.query"


def announce_subject(instance_id: str) -> str:
    return f"{ANNOUNCE}.{instance_id}"


def bye_subject(instance_id: str) -> str:
    return f"{BYE}.{instance_id}"


def _subject_id(msg: Msg) -> str:
    return msg.subject.rpartition(".")[2]


log = logging.getLogger(__name__)


class Announcement(msgspec.Struct, frozen=True, array_like=True):
    info: InstanceInfo
    ttl: float
    """The registrar's lease timeout: watchers drop it this long after its last heartbeat."""


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Announcement)


class NatsDiscovery:
    def __init__(self, nc: NatsClient, config: RuntimeConfig, vouch: Vouch) -> None:
        self._nc = nc
        self._config = config
        self._table = LeaseTable(vouch)
        self._own: dict[str, InstanceInfo] = {}
        self._heartbeats: dict[str, asyncio.Task[None]] = {}
        self._subs: list[NatsSubscription] = []
        self._answering: NatsSubscription | None = None
        self._rejoin: asyncio.Task[None] | None = None
        self._starting: asyncio.Task[None] | None = None
        """The table's start, shared by its first callers; None: nobody asked for the table."""
        self._closed = False

    async def start(self) -> None:
        """Start the table now if nobody has: subscribe to announcements, ask who is alive and
        wait for the answers. Concurrent callers share one start; one that failed is retried."""
        if self._closed:
            return
        task = self._starting
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            task = self._starting = asyncio.create_task(self._start(), name="discovery-start")
        await asyncio.wait([task])  # a caller cancelled here leaves the start to the others
        if not task.cancelled():  # cancelled: by close()
            task.result()

    def connection_lost(self) -> None:
        """The NATS link dropped: stop expiring leases until it is back."""
        self._table.suspend()

    def connection_restored(self) -> None:
        """The link is back (subscriptions already replayed): re-arm leases, re-announce our
        own instances and, if the table has started, ask who is alive, in the background."""
        self._table.resume()
        if self._rejoin is not None:
            self._rejoin.cancel()
        self._rejoin = asyncio.create_task(self._announce_and_ask(), name="discovery-rejoin")

    async def register(self, info: InstanceInfo) -> None:
        EndpointName.parse(info.endpoint)
        check_token(info.instance_id, "instance_id")
        if self._answering is None:
            self._answering = await self._nc.subscribe(QUERY, cb=self._on_query)
        self._stop_heartbeat(info.instance_id)
        self._own[info.instance_id] = info
        if self._starting is not None:  # visible here at once (else ``_start`` adds it)
            self._table.refresh(info, self._config.lease_timeout)
        await self._announce(info)
        self._heartbeats[info.instance_id] = asyncio.create_task(self._heartbeat(info))

    async def unregister(self, instance_id: str) -> None:
        self._stop_heartbeat(instance_id)
        if self._own.pop(instance_id, None) is not None:
            try:
                await self._nc.publish(bye_subject(instance_id), instance_id.encode())
            except (OutboundBufferLimitError, NatsError):
                pass  # in an outage or closed: the others expire it a ttl after they reconnect
        self._table.remove(instance_id, graceful=True)

    async def instances(self, endpoint: EndpointName | str) -> list[InstanceInfo]:
        await self.start()
        return self._table.instances(str(EndpointName.of(endpoint)))

    def watch(self, endpoint: EndpointName | str | None = None) -> AsyncGenerator[DiscoveryEvent, None]:
        name = None if endpoint is None else str(EndpointName.of(endpoint))
        return self._watch(name)

    def vouched(self) -> list[str]:
        """Instances kept alive by their request plane while silent on NATS (none before the
        table starts)."""
        if self._starting is None:
            return []
        return self._table.vouched()

    def abandon(self) -> None:
        """Stop heartbeating and answering without unregistering: a crash, for tests."""
        for instance_id in list(self._heartbeats):
            self._stop_heartbeat(instance_id)
        self._own.clear()

    async def close(self) -> None:
        self._closed = True
        for task in (self._rejoin, self._starting):
            if task is not None:
                task.cancel()
        for instance_id in list(self._own):
            await self.unregister(instance_id)
        for sub in self._subs + ([self._answering] if self._answering else []):
            with contextlib.suppress(NatsError):  # the connection is closed: nothing to undo
                await sub.unsubscribe()
        self._subs.clear()
        self._answering = None
        self._table.close()

    async def _start(self) -> None:
        for info in list(self._own.values()):  # registered before the table started
            self._table.refresh(info, self._config.lease_timeout)
        if not self._subs:  # a retried start may have subscribed already
            self._subs.append(await self._nc.subscribe(announce_subject("*"), cb=self._on_announce))
            self._subs.append(await self._nc.subscribe(bye_subject("*"), cb=self._on_bye))
        try:
            await self._ask()
        except NatsError:
            log.debug("discovery query failed; the reconnect asks again", exc_info=True)

    async def _watch(self, name: str | None) -> AsyncGenerator[DiscoveryEvent, None]:
        await self.start()
        if self._closed:
            return
        events = self._table.watch(name)
        async with contextlib.aclosing(events):
            async for event in events:
                yield event

    async def _ask(self) -> None:
        """Ask who is alive and wait ``discovery_sync_s`` for the answers."""
        if not self._nc.is_connected:
            return  # a flush would wait for the reconnect, which asks anyway
        # Asked twice: nats-server can drop a reply sent to a just-made subscription.
        for _ in range(2):
            await self._nc.publish(QUERY, b"")
            await self._nc.flush()
            await asyncio.sleep(self._config.discovery_sync_s / 2)

    async def _announce_and_ask(self) -> None:
        try:
            for info in list(self._own.values()):
                await self._announce(info)
            if self._starting is not None:
                await self._ask()
        except NatsError:
            pass  # dropped again meanwhile: the next reconnect starts this over

    async def _heartbeat(self, info: InstanceInfo) -> None:
        while True:
            await asyncio.sleep(self._config.heartbeat_interval)
            try:
                await self._announce(info)
            except NatsError:  # a heartbeat that dies leaves the instance to expire everywhere
                log.warning("heartbeat of %s failed", info.instance_id, exc_info=True)

    async def _announce(self, info: InstanceInfo) -> None:
        if not self._nc.is_connected:
            return  # buffered, it would arrive stale; the reconnect announces afresh
        await self._nc.publish(
            announce_subject(info.instance_id),
            _encoder.encode(Announcement(info, self._config.lease_timeout)),
        )

    def _stop_heartbeat(self, instance_id: str) -> None:
        task = self._heartbeats.pop(instance_id, None)
        if task is not None:
            task.cancel()

    async def _on_announce(self, msg: Msg) -> None:
        try:
            announcement = _decoder.decode(msg.data)
        except msgspec.DecodeError:
            return  # a foreign or newer publisher: not ours to crash on
        if announcement.info.instance_id != _subject_id(msg):
            log.warning("dropped an announcement of %r on %s", announcement.info.instance_id, msg.subject)
            return
        ttl = announcement.ttl
        if not (math.isfinite(ttl) and MIN_TTL_S <= ttl <= MAX_TTL_S):
            log.warning(
                "dropped an announcement of %s: ttl %r outside %g..%g s",
                announcement.info.instance_id,
                ttl,
                MIN_TTL_S,
                MAX_TTL_S,
            )
            return
        self._table.refresh(announcement.info, announcement.ttl)

    async def _on_bye(self, msg: Msg) -> None:
        if msg.data.decode(errors="replace") != _subject_id(msg):
            log.warning("dropped a bye of %r on %s", msg.data[:64], msg.subject)
            return
        self._table.remove(_subject_id(msg), graceful=True)

    async def _on_query(self, msg: Msg) -> None:
        for info in list(self._own.values()):
            await self._announce(info)
