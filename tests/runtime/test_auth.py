"""Authenticated planes: the TCP request plane's cluster handshake, and NATS credentials.

Each test plays an attacker who can reach the port or the NATS server but has no secret."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import anyio
import msgspec
import nats
import pytest

from interlock.errors import AuthError, ConfigError, TransportError
from interlock.protocol import InstanceInfo, subjects
from interlock.runtime import NatsAuth, NatsServer, RuntimeConfig, connect_runtime, generate_auth
from interlock.runtime.frames import Open, _encoder
from interlock.runtime.nats_server import find_binary
from interlock.runtime.tcp import TcpRequestPlane
from tests.certs import needs_openssl, self_signed
from tests.factories import load_report

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
    from interlock.router.worker_control import control_call
    from interlock.runtime import InProcRegistry, connect_runtime
    from tests.disagg.cluster import mock_engine

    registry = InProcRegistry()
    runtime = await connect_runtime(None, CFG, registry=registry)
    requests = TcpRequestPlane(WITH_SECRET)
    core = mock_engine()
    info = InstanceInfo(
        instance_id="w1",
        endpoint=subjects.GENERATE_ENDPOINT,
        model="m",
        block_size=core.block_size,
        kv_blocks_total=core.pool.num_blocks,
    )
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


# ---- NATS with credentials ----


@pytest.fixture(scope="module")
def authed() -> Iterator[NatsServer]:
    with NatsServer(auth=generate_auth()) as server:
        yield server


def _fast(server: NatsServer | None = None) -> RuntimeConfig:
    return replace(
        CFG, discovery_sync_s=0.05, nats_auth=server.auth if server and server.auth else NatsAuth()
    )


async def test_only_clients_with_the_credentials_get_in(authed: NatsServer, anyio_backend: str) -> None:
    assert authed.auth is not None and authed.auth.password is not None
    with anyio.fail_after(5):
        for attempt in (NatsAuth(), NatsAuth(user="interlock", password="guess"), NatsAuth(token="guess")):
            with pytest.raises(AuthError, match="refused our credentials"):
                await connect_runtime(authed.url, replace(CFG, nats_auth=attempt))
        runtime = await connect_runtime(authed.url, _fast(authed))
        await runtime.close()


async def test_unauthenticated_clients_can_neither_listen_nor_speak(
    authed: NatsServer, anyio_backend: str
) -> None:
    """The attacks seen without credentials: read prompts off ``interlock.kv.>``, register a
    fake worker, publish a forged 'draining' load report. None gets past the server."""
    real = await connect_runtime(authed.url, _fast(authed))
    try:
        heard = await real.events.subscribe(subjects.LOAD_ALL)
        for attempt in ({}, {"user": "interlock", "password": "guess"}):
            with anyio.fail_after(5), pytest.raises(Exception, match="(?i)authorization|no servers"):
                await nats.connect(
                    authed.url, max_reconnect_attempts=1, allow_reconnect=False, connect_timeout=1, **attempt
                )  # type: ignore[arg-type]
        with anyio.fail_after(5), pytest.raises(AuthError):
            await connect_runtime(authed.url, _fast())  # a fake worker: cannot even connect
        forged = load_report("w1", kv_blocks_total=1, draining=True)
        await real.events.publish(subjects.load("w1"), msgspec.msgpack.encode(forged))  # the real path works
        with anyio.fail_after(2):
            subject, _ = await heard.__anext__()
        assert subject == subjects.load("w1")
    finally:
        await real.close()


async def test_registration_and_events_flow_between_authenticated_peers(
    authed: NatsServer, anyio_backend: str
) -> None:
    a = await connect_runtime(authed.url, _fast(authed))
    b = await connect_runtime(authed.url, _fast(authed))
    try:
        info = InstanceInfo(instance_id="w1", endpoint="ns.worker.generate", model="m", address="tcp://h:1/k")
        await a.discovery.register(info)
        with anyio.fail_after(3):
            while not await b.discovery.instances("ns.worker.generate"):
                await asyncio.sleep(0.02)
    finally:
        await a.close()
        await b.close()


async def test_a_restarted_server_takes_the_same_credentials(anyio_backend: str) -> None:
    with NatsServer(auth=generate_auth()) as server:
        runtime = await connect_runtime(server.url, _fast(server))
        try:
            sub = await runtime.events.subscribe("interlock.t.x")
            await asyncio.to_thread(server.restart)
            with anyio.fail_after(10):
                while True:  # published until the reconnected subscription hears one
                    await runtime.events.publish("interlock.t.x", b"after")
                    with anyio.move_on_after(0.2):
                        assert (await sub.__anext__())[1] == b"after"
                        break
        finally:
            await runtime.close()


def test_credentials_stay_off_the_command_line_and_out_of_reach(authed: NatsServer) -> None:
    assert authed.auth is not None and authed.auth.password is not None and authed.pid is not None
    argv = Path(f"/proc/{authed.pid}/cmdline").read_bytes()
    assert authed.auth.password.encode() not in argv
    conf = Path(argv.split(b"\0-c\0", 1)[1].split(b"\0", 1)[0].decode())
    assert conf.stat().st_mode & 0o777 == 0o600
    assert authed.auth.password not in repr(authed.auth) and "cluster" not in repr(WITH_SECRET).lower()


def test_nats_auth_is_validated() -> None:
    for bad in (
        {"user": "u"},
        {"password": "p"},
        {"user": "u", "password": "p", "token": "t"},
        {"token": "t", "creds_file": "x.creds"},
        {"tls_cert": "c.pem"},
    ):
        with pytest.raises(ConfigError):
            NatsAuth(**bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="cluster secret"):
        RuntimeConfig(cluster_secret=b"short")
    assert NatsAuth(tls_ca="ca.pem").tls and not NatsAuth(token="t").tls


@needs_openssl
async def test_nats_over_tls_with_the_servers_ca(tmp_path: Path, anyio_backend: str) -> None:
    """An external nats-server with TLS (as docs/deploy.md sets one up): ``--nats-tls-ca`` (here
    ``NatsAuth.tls_ca``) connects and carries events; a client that does not trust it is refused."""
    cert, key = self_signed(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [
            str(find_binary()),
            "-a",
            "127.0.0.1",
            "-p",
            str(port),
            "--tls",
            "--tlscert",
            str(cert),
            "--tlskey",
            str(key),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"nats://127.0.0.1:{port}"
        with anyio.fail_after(10):
            while True:
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
                await asyncio.sleep(0.05)
        a = await connect_runtime(url, replace(CFG, nats_auth=NatsAuth(tls_ca=str(cert))))
        b = await connect_runtime(url, replace(CFG, nats_auth=NatsAuth(tls_ca=str(cert))))
        try:
            sub = await b.events.subscribe("interlock.tls.test")
            # core NATS may drop the first messages to a subscription made a moment before
            # (runtime/nats_discovery.py): publish until one arrives
            got: list[bytes] = []

            async def receive() -> None:
                got.append((await sub.__anext__())[1])

            with anyio.fail_after(5):
                task = asyncio.ensure_future(receive())
                while not task.done():
                    await a.events.publish("interlock.tls.test", b"over tls")
                    await asyncio.wait({task}, timeout=0.2)
                await task
            assert got == [b"over tls"]
        finally:
            await a.close()
            await b.close()
        with pytest.raises((AuthError, TransportError)):  # no CA given: the server's cert is not trusted
            await connect_runtime(
                url, replace(CFG, nats_auth=NatsAuth(tls_ca="/etc/ssl/certs/ca-certificates.crt"))
            )
    finally:
        server.kill()
        server.wait()
