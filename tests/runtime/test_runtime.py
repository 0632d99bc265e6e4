"""The factory and the Runtime bundle."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from interlock.errors import TransportError
from interlock.protocol import InstanceInfo
from interlock.runtime import NatsServer, RuntimeConfig, connect_runtime
from interlock.runtime.inproc import InProcDiscovery
from interlock.runtime.nats_discovery import NatsDiscovery
from interlock.runtime.tcp import TcpRequestPlane

from .conftest import FAST

pytestmark = pytest.mark.anyio


async def test_in_process_runtimes_share_the_loop_registry(anyio_backend: str) -> None:
    async with await connect_runtime(None) as a, await connect_runtime(None) as b:
        assert isinstance(a.discovery, InProcDiscovery)
        await a.discovery.register(InstanceInfo(instance_id="w1", endpoint="n.c.e", model="m"))
        assert [i.instance_id for i in await b.discovery.instances("n.c.e")] == ["w1"]
    async with await connect_runtime(None) as c:
        assert await c.discovery.instances("n.c.e") == []  # closed runtimes unregistered


def test_each_event_loop_starts_with_an_empty_registry() -> None:
    async def register_and_leave() -> int:
        runtime = await connect_runtime(None)
        found = len(await runtime.discovery.instances("n.c.e"))
        await runtime.discovery.register(InstanceInfo(instance_id="w1", endpoint="n.c.e", model="m"))
        return found  # not closed on purpose: the next loop must not see it

    assert asyncio.run(register_and_leave()) == 0
    assert asyncio.run(register_and_leave()) == 0


async def test_nats_runtime_uses_tcp_by_default(nats_server: NatsServer, anyio_backend: str) -> None:
    async with await connect_runtime(nats_server.url, RuntimeConfig(discovery_sync_s=0)) as runtime:
        assert isinstance(runtime.discovery, NatsDiscovery)
        assert isinstance(runtime.requests, TcpRequestPlane)


async def test_unreachable_nats_is_a_transport_error(anyio_backend: str) -> None:
    with pytest.raises(TransportError, match="cannot connect to NATS"):
        await connect_runtime("nats://127.0.0.1:1", RuntimeConfig(connect_timeout=0.5))


async def test_runtime_rides_through_a_nats_server_restart(anyio_backend: str) -> None:
    server = NatsServer().start()
    try:
        worker = await connect_runtime(server.url, FAST)
        router = await connect_runtime(server.url, FAST)
        await worker.discovery.register(InstanceInfo(instance_id="w1", endpoint="n.c.e", model="m"))
        with anyio.fail_after(2):
            while not await router.discovery.instances("n.c.e"):
                await asyncio.sleep(0.01)
        server.stop()
        await asyncio.sleep(FAST.lease_timeout * 1.5)
        # No heartbeats while it is down, but that silence is the router's own: it keeps w1.
        assert [i.instance_id for i in await router.discovery.instances("n.c.e")] == ["w1"]
        server = NatsServer(port=server.port).start()  # a fresh server, as an external one would be
        await asyncio.sleep(FAST.lease_timeout * 3)  # kept past a ttl only if heartbeats flow again
        assert [i.instance_id for i in await router.discovery.instances("n.c.e")] == ["w1"]
        await worker.close()
        await router.close()
    finally:
        server.stop()
