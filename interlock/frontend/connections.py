"""Open connections: a cap, and which of them are idle.

Idle and slow connections are closed by aiohttp's keep-alive timer (``idle_timeout_s``): it runs
from the moment a connection opens, and again from the end of each response, until a complete
request head has arrived, so it bounds both an idle keep-alive connection and one that sends its
headers slowly (slowloris). The body has its own deadline, in the handler.

The cap counts open connections. At the cap, a new connection closes the oldest connection with
no request in flight (idle, or still sending its head) to make room: a crowd of idle or slow
clients cannot lock others out, and /health keeps answering. Only when every connection is
serving a request is the newcomer turned away, with a 503.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

_REFUSAL_BODY = (
    b'{"error":{"message":"too many open connections; retry later","type":"service_unavailable",'
    b'"param":null,"code":"too_many_connections"}}'
)
_REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(_REFUSAL_BODY)
) + _REFUSAL_BODY


class ConnectionTracker:
    """Knows the open connections (through the protocol wrapper it makes) and which of them have
    a request in flight (through its middleware); builds the capped protocol factory."""

    def __init__(self) -> None:
        self._busy: Counter[object] = Counter()
        self._open: dict[_Counted, None] = {}  # in the order they opened

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        protocol = request.protocol
        self._busy[protocol] += 1
        try:
            return await handler(request)
        finally:
            self._busy[protocol] -= 1
            if self._busy[protocol] <= 0:
                del self._busy[protocol]

    @property
    def open_connections(self) -> int:
        return len(self._open)

    def capped(self, server: web.Server, max_connections: int) -> Callable[[], asyncio.BaseProtocol]:
        # Counted here, not from server.connections: the event loop accepts a burst of
        # connections before any of them reaches aiohttp's connection_made.
        def factory() -> asyncio.BaseProtocol:
            if len(self._open) >= max_connections:
                idle = next((c for c in self._open if c.handler not in self._busy), None)
                if idle is None:
                    return _Refuse()
                self._open.pop(idle)
                idle.close()
            conn = _Counted(server(), self._open)
            self._open[conn] = None
            return conn

        return factory


class _Counted(asyncio.Protocol):
    """aiohttp's protocol for one connection, which leaves the tracker's registry when closed."""

    def __init__(self, handler: RequestHandler, registry: dict[_Counted, None]) -> None:
        self.handler = handler
        self._registry = registry
        self._connected = False
        self._closed = False

    def close(self) -> None:
        self._closed = True
        if self._connected:
            self.handler.force_close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._closed:  # evicted between accept and here: aiohttp never saw it
            transport.close()
            return
        self._connected = True
        self.handler.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._connected:
            self.handler.data_received(data)

    def eof_received(self) -> None:
        self.handler.eof_received()

    def pause_writing(self) -> None:
        self.handler.pause_writing()

    def resume_writing(self) -> None:
        self.handler.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._registry.pop(self, None)
        if self._connected:
            self.handler.connection_lost(exc)


class _Refuse(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.write(_REFUSAL)
        transport.close()
