"""Request plane over NATS request/streamed reply (kept for comparison; TCP is the default).

Each call publishes ``b"R" + payload`` to the server's subject with a private reply subject;
the server publishes ``b"D" + chunk`` frames there, then ``b"E"`` (end) or ``b"X" + error``,
and ``b"K"`` keepalives while a handler runs, so a silent server is detected. The client
cancels by publishing its reply subject on the server's cancel subject. A call to a subject
nobody serves fails at once through NATS's no-responders status.

Address form: ``nats-rp://PLANE_ID/KEY``.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, field
from functools import partial

import msgspec
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription as NatsSubscription

from interlock.errors import TransportError
from interlock.runtime.channel import Channel, Item
from interlock.runtime.config import RuntimeConfig
from interlock.runtime.interfaces import CallContext, Handler
from interlock.runtime.naming import SUBJECT_PREFIX, EndpointName
from interlock.runtime.remote import remote_error, run_handler

SCHEME = "nats-rp://"
_NO_RESPONDERS = TransportError("no responders")
_RETRY_DELAYS = (0.0, 0.01, 0.05)


@dataclass(slots=True)
class _Call:
    channel: Channel[Item] = field(default_factory=Channel)
    last_heard: float = 0.0


def _subject(plane_id: str, key: str) -> str:
    return f"{SUBJECT_PREFIX}.rp.{plane_id}.{key}"


def _parse(address: str) -> tuple[str, str]:
    if not address.startswith(SCHEME):
        raise TransportError(f"not a NATS request-plane address: {address!r}")
    plane_id, _, key = address[len(SCHEME) :].partition("/")
    return plane_id, key


class NatsRequestPlane:
    def __init__(self, nc: NatsClient, config: RuntimeConfig) -> None:
        self._nc = nc
        self._config = config
        self._id = uuid.uuid4().hex[:16]
        self._served: dict[str, NatsSubscription] = {}
        self._serving: dict[str, asyncio.Task[None]] = {}
        self._control: list[NatsSubscription] = []
        self._cancels: NatsSubscription | None = None
        self._calls: dict[str, _Call] = {}
        self._inbox = ""
        self._ids = itertools.count(1)
        self._keepalive_task: asyncio.Task[None] | None = None

    # ---- server side ----
    async def serve(
        self, endpoint: EndpointName | str, handler: Handler, *, instance_id: str | None = None
    ) -> str:
        key = EndpointName.of(endpoint).key(instance_id)
        if self._cancels is None:
            self._cancels = await self._nc.subscribe(_subject(self._id, "_cancel"), cb=self._on_cancel)
            self._control.append(self._cancels)
        self._start_keepalive()
        if key in self._served:
            await self._served.pop(key).unsubscribe()
        self._served[key] = await self._nc.subscribe(
            _subject(self._id, key), cb=partial(self._on_request, key, handler)
        )
        await self._nc.flush()
        return f"{SCHEME}{self._id}/{key}"

    async def unserve(self, address: str) -> None:
        sub = self._served.pop(_parse(address)[1], None)
        if sub is not None:
            await sub.unsubscribe()
            await self._nc.flush()  # callers after this must get no-responders, not silence

    async def _on_request(self, key: str, handler: Handler, msg: Msg) -> None:
        reply = msg.reply
        if not reply:
            return
        if msg.data[:1] == b"P":
            await self._nc.publish(reply, b"P")
            return
        publish = self._nc.publish

        async def send(chunk: bytes) -> None:
            await publish(reply, b"D" + chunk)

        async def end() -> None:
            await publish(reply, b"E")

        async def fail(code: str, message: str, param: str | None) -> None:
            await publish(reply, b"X" + msgspec.msgpack.encode((code, message, param)))

        ctx = CallContext(key, next(self._ids))
        task = asyncio.create_task(run_handler(handler, msg.data[1:], ctx, send, end, fail))
        self._serving[reply] = task
        task.add_done_callback(lambda _: self._serving.pop(reply, None))

    async def _on_cancel(self, msg: Msg) -> None:
        task = self._serving.get(msg.data.decode())
        if task is not None:
            task.cancel()

    async def _keepalive(self) -> None:
        while True:
            await asyncio.sleep(self._config.keepalive_interval)
            for reply in list(self._serving):
                await self._nc.publish(reply, b"K")
            self._fail_silent_calls()

    # ---- client side ----
    def stream(self, address: str, payload: bytes) -> AsyncGenerator[bytes, None]:
        plane_id, key = _parse(address)
        return self._call(plane_id, key, b"R" + payload)

    async def ping(self, address: str, timeout: float | None = None) -> float:
        plane_id, key = _parse(address)
        loop = asyncio.get_running_loop()
        start = loop.time()
        try:
            async with asyncio.timeout(timeout or self._config.connect_timeout):
                async with aclosing(self._call(plane_id, key, b"P")) as replies:
                    async for _ in replies:
                        pass
        except TimeoutError:
            raise TransportError(f"no answer from {address}") from None
        return loop.time() - start

    async def _call(self, plane_id: str, key: str, body: bytes) -> AsyncGenerator[bytes, None]:
        await self._ensure_inbox()
        reply = f"{self._inbox}.{next(self._ids)}"
        call = self._calls[reply] = _Call(last_heard=asyncio.get_running_loop().time())
        subject = _subject(plane_id, key)
        finished = False
        try:
            await self._nc.publish(subject, body, reply=reply)
            for attempt in range(1, 1_000_000):
                item = await call.channel.get()
                if type(item) is bytes:
                    yield item
                elif item is None:
                    finished = True
                    return
                elif item is _NO_RESPONDERS and attempt <= len(_RETRY_DELAYS):
                    # nats-server occasionally answers no-responders for a subscription made
                    # just before (seen about 1 in 100 right after flush); retrying is safe
                    # because nothing was delivered.
                    await asyncio.sleep(_RETRY_DELAYS[attempt - 1])
                    await self._nc.publish(subject, body, reply=reply)
                else:
                    finished = True
                    raise TransportError(f"nobody serves {subject}") if item is _NO_RESPONDERS else item  # type: ignore[misc]
        finally:
            self._calls.pop(reply, None)
            if not finished and not self._nc.is_closed:
                await self._nc.publish(_subject(plane_id, "_cancel"), reply.encode())

    async def _ensure_inbox(self) -> None:
        if not self._inbox:
            self._inbox = self._nc.new_inbox()
            self._control.append(await self._nc.subscribe(f"{self._inbox}.*", cb=self._on_reply))
        self._start_keepalive()

    def _start_keepalive(self) -> None:
        """One task does both sides' timing: keepalives for calls served, expiry for calls made."""
        if self._keepalive_task is None:
            self._keepalive_task = asyncio.create_task(self._keepalive())

    async def _on_reply(self, msg: Msg) -> None:
        call = self._calls.get(msg.subject)
        if call is None:
            return
        call.last_heard = asyncio.get_running_loop().time()
        data = msg.data
        kind = data[:1]
        if kind == b"D":
            call.channel.put(data[1:])
        elif kind in (b"E", b"P"):
            call.channel.put(None)
        elif kind == b"X":
            code, message, param = msgspec.msgpack.decode(data[1:])
            call.channel.put(remote_error(code, message, param))
        elif not data and msg.headers and msg.headers.get("Status") == "503":
            call.channel.put(_NO_RESPONDERS)

    def _fail_silent_calls(self) -> None:
        now = asyncio.get_running_loop().time()
        for reply, call in list(self._calls.items()):
            if now - call.last_heard > self._config.peer_timeout:
                del self._calls[reply]
                call.channel.put(TransportError("server silent past peer_timeout"))

    async def close(self) -> None:
        if self._keepalive_task is not None:
            self._keepalive_task.cancel()
        closing = msgspec.msgpack.encode((TransportError.code, "server closed", None))
        for reply, task in list(self._serving.items()):
            task.cancel()
            if not self._nc.is_closed:
                await self._nc.publish(reply, b"X" + closing)
        for sub in list(self._served.values()) + self._control:
            if not self._nc.is_closed:
                await sub.unsubscribe()
        self._served.clear()
        self._control.clear()
        for call in self._calls.values():
            call.channel.put(TransportError("request plane closed"))
        self._calls.clear()
