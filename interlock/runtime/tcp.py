"""The TCP request plane: direct connections between processes, addresses in discovery.

The default request plane when running over NATS (NATS carries discovery and events only):
a token goes straight from worker to frontend in one hop, no broker in between. Figures in
docs/design.md ("Runtime planes") and ``benchmarks/request_plane.py``.

Address form: ``tcp://HOST:PORT/KEY`` where KEY is the handler key of ``EndpointName.key``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator

from interlock.errors import TransportError
from interlock.protocol.handshake import is_loopback
from interlock.runtime.channel import Opened, drain
from interlock.runtime.config import RuntimeConfig
from interlock.runtime.interfaces import Handler
from interlock.runtime.naming import EndpointName
from interlock.runtime.tcp_client import ClientConnection
from interlock.runtime.tcp_server import TcpServer

SCHEME = "tcp://"

log = logging.getLogger(__name__)


def parse_address(address: str) -> tuple[str, int, str]:
    """``tcp://HOST:PORT/KEY`` -> (host, port, key); TransportError if malformed."""
    if not address.startswith(SCHEME):
        raise TransportError(f"not a TCP address: {address!r}")
    hostport, _, key = address[len(SCHEME) :].partition("/")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit() or not key:
        raise TransportError(f"malformed TCP address: {address!r}")
    return host.strip("[]"), int(port), key


class TcpRequestPlane:
    def __init__(self, config: RuntimeConfig) -> None:
        self._config = config
        self._server = TcpServer(config.cluster_secret, handshake_timeout=config.connect_timeout)
        self._connections: dict[tuple[str, int], asyncio.Future[ClientConnection]] = {}

    async def serve(
        self, endpoint: EndpointName | str, handler: Handler, *, instance_id: str | None = None
    ) -> str:
        if not self._server.started:
            if self._config.cluster_secret is None and not is_loopback(self._config.host):
                log.warning(
                    "request plane listens on %s without a cluster secret: anyone who "
                    "reaches it can send requests (set INTERLOCK_CLUSTER_SECRET)",
                    self._config.host,
                )
            await self._server.start(self._config.host, self._config.port)
        key = EndpointName.of(endpoint).key(instance_id)
        self._server.handlers[key] = handler
        host = self._config.advertise_host or self._config.host
        if ":" in host:
            host = f"[{host}]"
        return f"{SCHEME}{host}:{self._server.port}/{key}"

    async def unserve(self, address: str) -> None:
        self._server.handlers.pop(parse_address(address)[2], None)

    def stream(self, address: str, payload: bytes) -> AsyncGenerator[bytes, None]:
        async def open_call() -> Opened:
            host, port, key = parse_address(address)
            conn = await self._connection(host, port)
            sid, channel = conn.open(key, payload)
            return channel, lambda: conn.cancel(sid)  # client gone: the server cancels the handler

        return drain(open_call)

    async def ping(self, address: str, timeout: float | None = None) -> float:
        host, port, key = parse_address(address)
        loop = asyncio.get_running_loop()
        start = loop.time()
        conn = await self._connection(host, port)
        if not await conn.ping(key, timeout or self._config.connect_timeout):
            raise TransportError(f"no handler at {address}")
        return loop.time() - start

    async def close(self) -> None:
        await self._server.close()
        for future in self._connections.values():
            if future.done() and not future.exception():
                future.result().fail("request plane closed")
        self._connections.clear()

    async def _connection(self, host: str, port: int) -> ClientConnection:
        """The live connection to ``host:port``, opened once even under concurrent calls."""
        future = self._connections.get((host, port))
        if future is not None and not (future.done() and _broken(future)):
            return await asyncio.shield(future)
        future = asyncio.get_running_loop().create_future()
        self._connections[(host, port)] = future
        try:
            conn = await self._open(host, port)
        except TransportError as exc:
            future.set_exception(exc)
            future.exception()  # consumed here; waiters get it via shield
            del self._connections[(host, port)]
            raise
        future.set_result(conn)
        return conn

    async def _open(self, host: str, port: int) -> ClientConnection:
        loop = asyncio.get_running_loop()
        cfg = self._config
        peer = f"{host}:{port}"
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(
                    lambda: ClientConnection(
                        peer, cfg.keepalive_interval, cfg.peer_timeout, cfg.cluster_secret
                    ),
                    host,
                    port,
                ),
                cfg.connect_timeout,
            )
        except (OSError, TimeoutError) as exc:
            raise TransportError(f"cannot connect to {peer}: {exc or 'timeout'}") from None
        try:
            await asyncio.wait_for(asyncio.shield(conn.ready), cfg.connect_timeout)
        except TimeoutError:
            conn.fail(f"no handshake from {peer} within {cfg.connect_timeout} s")
            raise TransportError(f"no handshake from {peer} within {cfg.connect_timeout} s") from None
        return conn


def _broken(future: asyncio.Future[ClientConnection]) -> bool:
    return future.exception() is not None or future.result().closed
