"""TCP request-plane specifics: addresses, connect failures and a silent peer."""

from __future__ import annotations

import asyncio
import socket

import anyio
import pytest

from interlock.errors import TransportError
from interlock.runtime import RuntimeConfig
from interlock.runtime.tcp import TcpRequestPlane, parse_address

pytestmark = pytest.mark.anyio

SHORT = RuntimeConfig(heartbeat_interval=0.1, lease_timeout=0.5, connect_timeout=0.5, peer_timeout=0.4)


def test_parse_address() -> None:
    assert parse_address("tcp://127.0.0.1:4000/ns.c.e.w1") == ("127.0.0.1", 4000, "ns.c.e.w1")
    assert parse_address("tcp://[::1]:4000/ns.c.e") == ("::1", 4000, "ns.c.e")
    for bad in ("inproc://x", "tcp://host/ns.c.e", "tcp://host:x/ns.c.e", "tcp://h:1/"):
        with pytest.raises(TransportError):
            parse_address(bad)


async def test_advertised_address(anyio_backend: str) -> None:
    plane = TcpRequestPlane(RuntimeConfig(advertise_host="worker-3.example"))
    try:

        async def handler(payload: bytes, ctx: object):  # type: ignore[no-untyped-def]
            yield payload

        address = await plane.serve("ns.worker.generate", handler, instance_id="w1")
        host, port, key = parse_address(address)
        assert (host, key) == ("worker-3.example", "ns.worker.generate.w1") and port > 0
    finally:
        await plane.close()


async def test_connection_refused_is_a_transport_error(anyio_backend: str) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    plane = TcpRequestPlane(SHORT)
    with anyio.fail_after(1), pytest.raises(TransportError, match="cannot connect"):
        async for _ in plane.stream(f"tcp://127.0.0.1:{port}/ns.c.e", b""):
            pass
    await plane.close()


async def test_silent_peer_times_out(anyio_backend: str) -> None:
    """A server that accepts and then never answers (wedged process) must not hang the client."""

    async def wedged(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(-1)

    server = await asyncio.start_server(wedged, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    plane = TcpRequestPlane(SHORT)
    try:
        with anyio.fail_after(SHORT.peer_timeout * 3), pytest.raises(TransportError, match="silent"):
            async for _ in plane.stream(f"tcp://127.0.0.1:{port}/ns.c.e", b""):
                pass
    finally:
        await plane.close()
        server.close()


async def test_fixed_port(anyio_backend: str) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    plane = TcpRequestPlane(RuntimeConfig(port=port))
    try:

        async def handler(payload: bytes, ctx: object):  # type: ignore[no-untyped-def]
            yield payload

        address = await plane.serve("ns.worker.generate", handler)
        assert parse_address(address)[1] == port
        assert [c async for c in plane.stream(address, b"hi")] == [b"hi"]
    finally:
        await plane.close()
