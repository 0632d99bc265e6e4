"""Event plane over NATS subjects: KV events and load reports, fire-and-forget."""

from __future__ import annotations

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription as NatsSubscription

from interlock.runtime.subscription import Subscription


class NatsEventPlane:
    def __init__(self, nc: NatsClient) -> None:
        self._nc = nc
        self._own: list[Subscription] = []

    async def publish(self, subject: str, payload: bytes) -> None:
        await self._nc.publish(subject, payload)

    async def subscribe(self, subject: str) -> Subscription:
        nats_subs: list[NatsSubscription] = []

        async def on_close() -> None:
            for nats_sub in nats_subs:
                await nats_sub.unsubscribe()

        sub = Subscription(subject, on_close)

        async def on_msg(msg: Msg) -> None:
            sub.deliver(msg.subject, msg.data)

        nats_subs.append(await self._nc.subscribe(subject, cb=on_msg))
        # The interest must reach the server before we return, or an immediate publish from
        # another connection could be missed.
        await self._nc.flush()
        self._own.append(sub)
        return sub

    async def close(self) -> None:
        for sub in self._own:
            await sub.close()
        self._own.clear()
