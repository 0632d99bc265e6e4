"""Authenticated planes: the TCP request plane's cluster handshake, and NATS credentials.

Each test plays an attacker who can reach the port or the NATS server but has no secret."""

from __future__ import annotations

import asyncio
import socket
from dataclasses import replace

import anyio
import pytest

from interlock.errors import AuthError, TransportError
from interlock.runtime import RuntimeConfig
from interlock.runtime.frames import Open, _encoder
from interlock.runtime.tcp import TcpRequestPlane

pytestmark = pytest.mark.anyio

SECRET = b"cluster-secret-for-tests-0123456789"
CFG = RuntimeConfig(heartbeat_interval=0.1, lease_timeout=0.5, connect_timeout=0.5, peer_timeout=1.0)
WITH_SECRET = replace(CFG, cluster_secret=SECRET)


class Recorder:
    """An echo handler that remembers every payload it was given."""

    def __init__(self) -> None:
        self.seen: list[bytes] = []

    async def __call__(self, payload: bytes, ctx: object):  # type: ignore[no-untyped-def]
        self.seen.append(payload)
        yield payload


async def _collect(plane: TcpRequestPlane, address: str, payload: bytes) -> list[bytes]:
    return [chunk async for chunk in plane.stream(address, payload)]


async def test_peers_with_the_secret_talk(anyio_backend: str) -> None:
    server, client = TcpRequestPlane(WITH_SECRET), TcpRequestPlane(WITH_SECRET)
    try:
        address = await server.serve("ns.worker.generate", Recorder(), instance_id="w1")
        with anyio.fail_after(2):
            assert await _collect(client, address, b"hi") == [b"hi"]
            assert await _collect(client, address, b"again") == [b"again"]  # same connection
            assert await client.ping(address) > 0
    finally:
        await client.close()
        await server.close()


async def test_a_client_without_the_secret_gets_no_request_through(anyio_backend: str) -> None:
    handler = Recorder()
    server = TcpRequestPlane(WITH_SECRET)
    for attacker_cfg in (CFG, replace(CFG, cluster_secret=b"a-wrong-secret-of-enough-length")):
        attacker = TcpRequestPlane(attacker_cfg)
        try:
            address = await server.serve("ns.worker.generate", handler, instance_id="w1")
            with anyio.fail_after(2), pytest.raises(TransportError):
                await _collect(attacker, address, b"prompt")
        finally:
            await attacker.close()
    assert handler.seen == []
    await server.close()


async def test_raw_frames_before_the_handshake_are_never_read(anyio_backend: str) -> None:
    """A hand-made ``Open`` frame, no handshake: dropped without reaching the handler."""
    handler = Recorder()
    server = TcpRequestPlane(WITH_SECRET)
    try:
        address = await server.serve("ns.worker.generate", handler, instance_id="w1")
        port = int(address.rsplit(":", 1)[1].split("/")[0])
        body = _encoder.encode(Open(1, "ns.worker.generate.w1", b"prompt"))
        frame = len(body).to_bytes(4, "big") + body
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(frame * 4)  # 4 frames: more bytes than the hello, as a hello they are wrong
        with anyio.fail_after(2):
            assert await reader.read() == b""  # dropped
        writer.close()
        assert handler.seen == [] and server._server.refused == 1
    finally:
        await server.close()


async def test_a_silent_client_is_dropped(anyio_backend: str) -> None:
    server = TcpRequestPlane(replace(WITH_SECRET, connect_timeout=0.2))
    try:
        address = await server.serve("ns.worker.generate", Recorder(), instance_id="w1")
        port = int(address.rsplit(":", 1)[1].split("/")[0])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        with anyio.fail_after(2):
            assert await reader.read() == b""
        writer.close()
    finally:
        await server.close()


async def test_a_fake_server_learns_no_request(anyio_backend: str) -> None:
    """A worker address pointing at an impostor (no secret, or another one): the client drops
    it before sending the request, so the impostor never sees the prompt."""
    client = TcpRequestPlane(WITH_SECRET)
    for impostor_cfg, error in ((CFG, TransportError), (replace(CFG, cluster_secret=b"x" * 32), AuthError)):
        impostor, handler = TcpRequestPlane(impostor_cfg), Recorder()
        try:
            address = await impostor.serve("ns.worker.generate", handler, instance_id="w1")
            with anyio.fail_after(2), pytest.raises(error):
                await _collect(client, address, b"prompt")
            assert handler.seen == []
        finally:
            await impostor.close()
    await client.close()


async def test_a_listener_that_never_answers_the_hello_times_out(anyio_backend: str) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        client = TcpRequestPlane(replace(WITH_SECRET, connect_timeout=0.2))
        with anyio.fail_after(2), pytest.raises(TransportError, match="no handshake"):
            await _collect(client, f"tcp://127.0.0.1:{port}/ns.c.e", b"prompt")
        await client.close()


async def test_a_control_call_without_the_secret_is_refused(anyio_backend: str) -> None:
    """``set_role`` from an attacker who reached the worker's port: refused, role unchanged."""
    from interlock.engine.worker import Worker
    from interlock.protocol import InstanceInfo, subjects
    from interlock.protocol.control import ControlRequest
    from interlock.router.disagg_flow import control_call
    from interlock.runtime import InProcRegistry, connect_runtime
    from tests.disagg.cluster import mock_engine

    registry = InProcRegistry()
    runtime = await connect_runtime(None, CFG, registry=registry)
    requests = TcpRequestPlane(WITH_SECRET)
    core = mock_engine()
    info = InstanceInfo(instance_id="w1", endpoint=subjects.GENERATE_ENDPOINT, model="m",
                        block_size=core.block_size, kv_blocks_total=core.pool.num_blocks)
    worker = Worker(core, info, discovery=runtime.discovery, requests=requests, events=runtime.events)
    await worker.start()
    attacker, operator = TcpRequestPlane(CFG), TcpRequestPlane(WITH_SECRET)
    try:
        (registered,) = await runtime.discovery.instances(subjects.GENERATE_ENDPOINT)
        address = registered.metadata["control_address"]
        set_role = ControlRequest(op="set_role", role="prefill", grace_s=0.1)
        with anyio.fail_after(3), pytest.raises(TransportError):
            await control_call(attacker, address, set_role)
        (still,) = await runtime.discovery.instances(subjects.GENERATE_ENDPOINT)
        assert still.role == "both"
        with anyio.fail_after(3):
            reply = await control_call(operator, address, set_role)
        assert reply.ok and reply.role == "prefill"
    finally:
        await attacker.close()
        await operator.close()
        await worker.drain(grace_s=0.1)
        await requests.close()
        await runtime.close()
        registry.leases.close()
