"""Client side of the TCP request plane: one connection per server, many calls on it.

Liveness: while a connection has calls in flight it pings every ``keepalive_interval``; the
server answers at connection level whatever its handlers are doing, so hearing nothing for
``peer_timeout`` means the peer is dead or wedged, and every call on it fails with
TransportError. A dropped connection (peer process killed) fails them at once.

With a cluster secret the connection is ``ready`` only once the server has proved it knows the
secret and we have answered (``protocol.handshake``); no call is sent before.
"""

from __future__ import annotations

import asyncio
import itertools

from interlock.errors import AuthError, TransportError
from interlock.protocol.handshake import CHALLENGE_SIZE, ClientHandshake
from interlock.runtime.channel import Channel, Item
from interlock.runtime.frames import Cancel, Data, End, Fail, Frame, FramedProtocol, Open, Ping, Pong
from interlock.runtime.remote import remote_error


class ClientConnection(FramedProtocol):
    def __init__(
        self, peer: str, keepalive_interval: float, peer_timeout: float, secret: bytes | None = None
    ) -> None:
        super().__init__()
        self.peer = peer
        self.closed = False
        self._keepalive_interval = keepalive_interval
        self._peer_timeout = peer_timeout
        self._calls: dict[int, Channel[Item]] = {}
        self._pings: dict[int, asyncio.Future[bool]] = {}
        self._ids = itertools.count(1)
        self._loop = asyncio.get_running_loop()
        self._last_heard = self._loop.time()
        self._keepalive: asyncio.Task[None] | None = None
        self._handshake = ClientHandshake(secret) if secret is not None else None
        self.ready: asyncio.Future[None] = self._loop.create_future()
        """Done when calls may be sent (the handshake passed); a TransportError if it failed."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._keepalive = asyncio.create_task(self._watch_peer())
        if self._handshake is None:
            self.ready.set_result(None)
            return
        self.send_raw(self._handshake.hello())
        self.expect_preamble(CHALLENGE_SIZE)

    def preamble_received(self, message: bytes) -> None:
        assert self._handshake is not None
        try:
            self.send_raw(self._handshake.answer(message))
        except AuthError as exc:
            self.fail(f"{self.peer}: {exc}", AuthError)
            return
        self.ready.set_result(None)

    def open(self, key: str, payload: bytes) -> tuple[int, Channel[Item]]:
        if self.closed:
            raise TransportError(f"connection to {self.peer} is closed")
        if not self._calls and not self._pings:
            self._last_heard = self._loop.time()  # silence while idle is not a fault
        sid = next(self._ids)
        channel = self._calls[sid] = Channel[Item]()
        self.send(Open(sid, key, payload))
        return sid, channel

    def cancel(self, sid: int) -> None:
        if self._calls.pop(sid, None) is not None and not self.closed:
            self.send(Cancel(sid))

    async def ping(self, key: str, timeout: float) -> bool:
        if self.closed:
            raise TransportError(f"connection to {self.peer} is closed")
        nonce = next(self._ids)
        future = self._loop.create_future()
        self._pings[nonce] = future
        self.send(Ping(nonce, key))
        try:
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise TransportError(f"no answer from {self.peer} within {timeout} s") from None
        finally:
            self._pings.pop(nonce, None)

    def data_received(self, data: bytes) -> None:
        self._last_heard = self._loop.time()
        super().data_received(data)

    def frame_received(self, frame: Frame) -> None:
        kind = type(frame)
        if kind is Data:
            channel = self._calls.get(frame.stream_id)  # type: ignore[union-attr]
            if channel is not None:
                channel.put(frame.payload)  # type: ignore[union-attr]
        elif kind is End:
            channel = self._calls.pop(frame.stream_id, None)  # type: ignore[union-attr]
            if channel is not None:
                channel.put(None)
        elif kind is Fail:
            assert isinstance(frame, Fail)
            channel = self._calls.pop(frame.stream_id, None)
            if channel is not None:
                channel.put(remote_error(frame.code, frame.message, frame.param))
        elif kind is Pong:
            assert isinstance(frame, Pong)
            future = self._pings.get(frame.nonce)
            if future is not None and not future.done():
                future.set_result(frame.ok)
        else:
            self.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.fail(f"connection to {self.peer} lost")

    def fail(self, reason: str, error: type[TransportError] = TransportError) -> None:
        """End every call on this connection with TransportError and drop the socket."""
        if self.closed:
            return
        self.closed = True
        if not self.ready.done():
            self.ready.set_exception(error(reason))
            self.ready.exception()  # retrieved here: nobody may be waiting any more
        if self._keepalive is not None:
            self._keepalive.cancel()
        for channel in self._calls.values():
            channel.put(TransportError(reason))
        self._calls.clear()
        for future in self._pings.values():
            if not future.done():
                future.set_exception(TransportError(reason))
        self.abort()

    async def _watch_peer(self) -> None:
        while True:
            await asyncio.sleep(self._keepalive_interval)
            if not self._calls and not self._pings:
                continue
            if self._loop.time() - self._last_heard > self._peer_timeout:
                self.fail(f"{self.peer} silent for more than {self._peer_timeout} s")
                return
            self.send(Ping(0, ""))
