"""Server side of the TCP request plane: one listening socket, many handlers by key.

Each accepted connection runs every call it carries as its own task. A ``Cancel`` frame or
the connection dropping (client process gone) cancels the call's task, which cancels the
handler's generator at its current ``await``.

With a cluster secret, a connection first runs the handshake (``protocol.handshake``): no frame
is decoded until the client has proved it knows the secret, and a client that fails (or stays
silent past ``handshake_timeout``) is dropped with a log line.
"""

from __future__ import annotations

import asyncio
import logging

from interlock.errors import AuthError, TransportError
from interlock.protocol.handshake import HELLO_SIZE, RESPONSE_SIZE, ServerHandshake
from interlock.runtime.frames import Cancel, Data, End, Fail, Frame, FramedProtocol, Open, Ping, Pong
from interlock.runtime.interfaces import CallContext, Handler
from interlock.runtime.remote import run_handler

log = logging.getLogger(__name__)


class TcpServer:
    def __init__(self, secret: bytes | None = None, handshake_timeout: float = 5.0) -> None:
        self.secret = secret
        self.handshake_timeout = handshake_timeout
        self.refused = 0
        """Connections dropped because they failed the handshake."""
        self.handlers: dict[str, Handler] = {}
        self.connections: set[ServerConnection] = set()
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self, host: str, port: int = 0) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: ServerConnection(self), host, port)
        self.port = self._server.sockets[0].getsockname()[1]

    @property
    def started(self) -> bool:
        return self._server is not None

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.abort()  # connection_lost cancels its calls; clients see the drop
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None


class ServerConnection(FramedProtocol):
    def __init__(self, server: TcpServer) -> None:
        super().__init__()
        self._server = server
        self._calls: dict[int, asyncio.Task[None]] = {}
        self._handshake: ServerHandshake | None = None
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._server.connections.add(self)
        if self._server.secret is not None:
            self._handshake = ServerHandshake(self._server.secret)
            self.expect_preamble(HELLO_SIZE)
            self._deadline = asyncio.get_running_loop().call_later(
                self._server.handshake_timeout, self._refuse, "no handshake in time"
            )

    def preamble_received(self, message: bytes) -> None:
        assert self._handshake is not None
        try:
            if self._handshake.expecting_hello:
                self.send_raw(self._handshake.challenge(message))
                self.expect_preamble(RESPONSE_SIZE)
                return
            self._handshake.verify(message)
        except AuthError as exc:
            self._refuse(str(exc))
            return
        if self._deadline is not None:
            self._deadline.cancel()

    def _refuse(self, reason: str) -> None:
        self._server.refused += 1
        peer = self.transport.get_extra_info("peername") if self.transport is not None else None
        log.warning("request plane: refused connection from %s: %s", peer, reason)
        self.abort()

    def frame_received(self, frame: Frame) -> None:
        if type(frame) is Open:
            self._open(frame)
        elif type(frame) is Cancel:
            task = self._calls.get(frame.stream_id)
            if task is not None:
                task.cancel()
        elif type(frame) is Ping:
            self.send(Pong(frame.nonce, not frame.key or frame.key in self._server.handlers))
        else:
            self.abort()  # a client never sends anything else: protocol error

    def _open(self, frame: Open) -> None:
        sid = frame.stream_id
        handler = self._server.handlers.get(frame.key)
        if handler is None:
            self.send(Fail(sid, TransportError.code, f"no handler for {frame.key!r}"))
            return

        async def send(chunk: bytes) -> None:
            self.send(Data(sid, chunk))
            await self.drain()

        async def end() -> None:
            self.send(End(sid))

        async def fail(code: str, message: str, param: str | None) -> None:
            self.send(Fail(sid, code, message, param))

        ctx = CallContext(frame.key, sid)
        task = asyncio.create_task(run_handler(handler, frame.payload, ctx, send, end, fail))
        self._calls[sid] = task
        task.add_done_callback(lambda _: self._calls.pop(sid, None))

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self._deadline is not None:
            self._deadline.cancel()
        self._server.connections.discard(self)
        for task in self._calls.values():
            task.cancel()
