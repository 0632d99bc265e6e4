"""Event plane over NATS subjects: KV events and load reports, fire-and-forget.

While the NATS link is down (``ControlLink``: disconnected, or a server that stopped answering),
publishes are dropped (counted in ``dropped``) rather than raised or buffered: they would be
stale when the link returns, and subscribers re-sync anyway (discovery re-announces every
instance after an outage; a KV event stream with a gap asks for a snapshot). A publish that
finds nats-py's buffer full in the moment before the link is known to be down is dropped too.
Subscriptions made before or during an outage are replayed by nats-py on reconnect.
"""

from __future__ import annotations

import contextlib

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription as NatsSubscription
from nats.errors import Error as NatsError
from nats.errors import OutboundBufferLimitError

from interlock.runtime.link import ControlLink
from interlock.runtime.subscription import Subscription, Subscriptions


class NatsEventPlane:
    def __init__(self, nc: NatsClient, link: ControlLink) -> None:
        self._nc = nc
        self._link = link
        self._own = Subscriptions()
        self.dropped = 0
        """Publishes dropped in an outage."""

    async def publish(self, subject: str, payload: bytes) -> None:
        if not self._link.up:
            self.dropped += 1
            return
        try:
            await self._nc.publish(subject, payload)
        except OutboundBufferLimitError:
            self.dropped += 1

    async def subscribe(self, subject: str) -> Subscription:
        nats_subs: list[NatsSubscription] = []

        async def on_close() -> None:
            for nats_sub in nats_subs:
                with contextlib.suppress(NatsError):  # the connection is closed: nothing to undo
                    await nats_sub.unsubscribe()

        sub = Subscription(subject, on_close)

        async def on_msg(msg: Msg) -> None:
            sub.deliver(msg.subject, msg.data)

        nats_subs.append(await self._nc.subscribe(subject, cb=on_msg))
        # The interest must reach the server before we return, or an immediate publish from
        # another connection could be missed. (Disconnected, there is nothing to wait for: the
        # reconnect replays it, and flush would only wait out its timeout.)
        if self._nc.is_connected:
            await self._nc.flush()
        return self._own.add(sub)

    async def close(self) -> None:
        await self._own.close()
