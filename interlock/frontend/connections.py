"""Open connections: a fair cap, a reserve for probes, and what each connection is doing.

Idle and slow connections are closed by aiohttp's keep-alive timer (``idle_timeout_s``): it runs
from the moment a connection opens, and again from the end of each response, until a complete
request head has arrived, so it bounds both an idle keep-alive connection and one that sends its
headers slowly (slowloris). A body has its own deadline and minimum rate (``body.py``).

Who gives way when the frontend is full is decided in ``fairness.admit``; this module carries it
out. A protocol wrapper asks for admission when a connection opens (then the peer's address is
known; the registry counts a connection from that moment, so a burst the event loop accepted in
one go is counted one by one), closes the connection it was told to evict, and leaves the
registry when its connection closes. The middleware marks a connection RECEIVING while its
request's body may still arrive, the handler marks it SERVING once the body is read
(``body_read``), and it is IDLE again when the handler returns. A connection admitted into the
reserve answers any request but the reserved paths with a 503 and is closed.

With TLS the wrapper sees a connection once its handshake is done; the handshake itself is
bounded by asyncio's ``ssl_handshake_timeout``.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from interlock.frontend.fairness import RESERVED_PATHS, ConnectionLimits, State, admit, client_of

_REFUSAL_BODY = (
    b'{"error":{"message":"too many open connections; retry later","type":"service_unavailable",'
    b'"param":null,"code":"too_many_connections"}}'
)
_REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(_REFUSAL_BODY)
) + _REFUSAL_BODY

Shed = Callable[[str], None]
"""Told the reason each time a connection or request is shed (for a metric)."""


class ConnectionTracker:
    """The registry of open connections, their clients and states; the capped protocol factory
    and the middleware that keeps the states."""

    def __init__(self, limits: ConnectionLimits, on_shed: Shed | None = None) -> None:
        self.limits = limits
        self._on_shed = on_shed or (lambda reason: None)
        self._regular: dict[_Tracked, None] = {}  # in the order they opened
        self._reserve: dict[_Tracked, None] = {}
        self._counts: Counter[str] = Counter()
        self._by_handler: dict[RequestHandler, _Tracked] = {}

    @property
    def open_connections(self) -> int:
        return len(self._regular) + len(self._reserve)

    def factory(self, server: web.Server) -> Callable[[], asyncio.BaseProtocol]:
        return lambda: _Tracked(self, server)

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        conn = self._by_handler.get(request.protocol)
        if conn is None:  # served through some other listener: nothing to track
            return await handler(request)
        if conn.reserve and request.path not in RESERVED_PATHS:
            self._on_shed("reserve_only")
            refusal = web.Response(
                body=_REFUSAL_BODY, status=503, content_type="application/json", headers={"Retry-After": "1"}
            )
            refusal.force_close()
            return refusal
        conn.state = State.RECEIVING if request.can_read_body else State.SERVING
        try:
            return await handler(request)
        finally:
            conn.state = State.IDLE

    def body_read(self, request: web.Request) -> None:
        """The request's body is in: its connection now serves it and is never evicted."""
        conn = self._by_handler.get(request.protocol)
        if conn is not None:
            conn.state = State.SERVING

    def client(self, request: web.Request) -> str:
        conn = self._by_handler.get(request.protocol)
        return conn.client if conn is not None else client_of(request.remote)

    def _admit(self, conn: _Tracked) -> bool:
        decision = admit(conn.client, self._regular.keys(), self._reserve.keys(), self._counts, self.limits)
        if decision is None:
            self._on_shed("refused")
            return False
        if decision.evict is not None:
            self._on_shed(f"evicted_{decision.evict.state.name.lower()}")
            self._forget(decision.evict)
            decision.evict.close()
        conn.reserve = decision.reserve
        (self._reserve if conn.reserve else self._regular)[conn] = None
        self._counts[conn.client] += 1
        self._by_handler[conn.handler] = conn
        return True

    def _forget(self, conn: _Tracked) -> None:
        pool = self._reserve if conn.reserve else self._regular
        if conn in pool:  # an evicted connection was forgotten already
            del pool[conn]
            self._by_handler.pop(conn.handler, None)
            self._counts[conn.client] -= 1
            if self._counts[conn.client] <= 0:
                del self._counts[conn.client]


class _Tracked(asyncio.Protocol):
    """aiohttp's protocol for one connection, admitted by the tracker when it opens."""

    def __init__(self, tracker: ConnectionTracker, server: web.Server) -> None:
        self._tracker = tracker
        self.handler: RequestHandler = server()
        self.client = "?"
        self.state = State.IDLE
        self.reserve = False
        self._connected = False

    def close(self) -> None:
        if self._connected:
            self.handler.force_close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.client = client_of(transport.get_extra_info("peername"))
        if not self._tracker._admit(self):
            assert isinstance(transport, asyncio.Transport)
            transport.write(_REFUSAL)
            transport.close()
            return
        self._connected = True
        self.handler.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._connected:
            self.handler.data_received(data)

    def eof_received(self) -> None:
        if self._connected:
            self.handler.eof_received()

    def pause_writing(self) -> None:
        if self._connected:
            self.handler.pause_writing()

    def resume_writing(self) -> None:
        if self._connected:
            self.handler.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._connected:
            self._tracker._forget(self)
            self.handler.connection_lost(exc)
