"""The NATS server hangs (SIGSTOP: the sockets stay open, nothing answers) while runtimes run.

Nobody may be dropped for a silence that is the server's: every runtime notices the hang within
its probe timeout, suspends its leases and reports the control plane unreachable; a lease that
ran out anyway is kept by a ping on the request plane. Once the server resumes, every instance
is re-announced (watchers re-sync) and the link reads connected again. An instance that really
went silent on both planes still leaves.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing

import anyio
import pytest

from interlock.protocol import InstanceInfo
from interlock.runtime import CallContext, DiscoveryEvent, NatsServer, connect_runtime
from interlock.runtime.leases import LeaseTable

from .conftest import FAST
from .test_nats_restart import ENDPOINT, Watch, ids

pytestmark = pytest.mark.anyio
HANG_S = FAST.lease_timeout * 6


@pytest.fixture
def server() -> Iterator[NatsServer]:
    """A server of this test's own, since it gets stopped."""
    with NatsServer() as server:
        yield server
        assert server.pid is not None
        os.kill(server.pid, signal.SIGCONT)  # whatever the test did, let it exit


def info(instance_id: str, address: str) -> InstanceInfo:
    return InstanceInfo(instance_id=instance_id, endpoint=ENDPOINT, model="m", address=address)


async def echo(payload: bytes, ctx: CallContext) -> AsyncIterator[bytes]:
    yield payload


async def test_a_hung_server_drops_nobody_and_streams_go_on(server: NatsServer, anyio_backend: str) -> None:
    assert server.pid is not None
    async with (
        await connect_runtime(server.url, FAST) as worker,
        await connect_runtime(server.url, FAST) as router,
    ):
        address = await worker.requests.serve(ENDPOINT, echo, instance_id="w1")
        await worker.discovery.register(info("w1", address))
        watch = Watch(router)
        await watch.wait_for(DiscoveryEvent("added", info("w1", address)), timeout=2)
        watch.take()
        assert router.link is not None and worker.link is not None
        assert router.link.status().state == "connected"

        os.kill(server.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        while time.monotonic() - stopped < HANG_S:
            await asyncio.sleep(0.2)
            async with aclosing(router.requests.stream(address, b"ping")) as stream:
                assert [c async for c in stream] == [b"ping"]  # the request plane never stopped
            assert await ids(router) == ["w1"]
        assert router.link.status().state == "unreachable"
        assert worker.link.status().state == "unreachable"
        await worker.events.publish("n.kv.w1", b"stale")  # dropped, never raised nor blocking
        assert watch.take() == []  # no removed

        os.kill(server.pid, signal.SIGCONT)
        resumed = time.monotonic()
        await watch.wait_for(DiscoveryEvent("added", info("w1", address)), timeout=5)  # a re-sync
        print(f"re-announced {time.monotonic() - resumed:.2f} s after SIGCONT")
        with anyio.fail_after(5):
            while router.link.status().state != "connected" or worker.link.status().state != "connected":
                await asyncio.sleep(0.05)
        assert router.link.status().outages == 1
        assert await ids(router) == ["w1"]
        watch.stop()


async def test_an_instance_silent_on_nats_but_serving_is_kept_and_one_silent_on_both_leaves(
    server: NatsServer, anyio_backend: str
) -> None:
    """Heartbeats stop (as when a worker is cut off from NATS alone): the one still answering
    its request plane stays, unconfirmed; the one that stopped serving too leaves."""
    async with await connect_runtime(server.url, FAST) as router:
        cut_off, dead = await connect_runtime(server.url, FAST), await connect_runtime(server.url, FAST)
        a1 = await cut_off.requests.serve(ENDPOINT, echo, instance_id="w1")
        a2 = await dead.requests.serve(ENDPOINT, echo, instance_id="w2")
        await cut_off.discovery.register(info("w1", a1))
        await dead.discovery.register(info("w2", a2))
        watch = Watch(router)
        await watch.wait_for(DiscoveryEvent("added", info("w2", a2)), timeout=2)
        watch.take()

        cut_off.discovery.abandon()  # type: ignore[attr-defined]  # heartbeats stop, serving goes on
        dead.discovery.abandon()  # type: ignore[attr-defined]
        await dead.requests.close()
        await watch.wait_for(DiscoveryEvent("removed", info("w2", a2)), timeout=FAST.lease_timeout + 3)
        assert watch.take() == [DiscoveryEvent("removed", info("w2", a2))]
        await asyncio.sleep(FAST.lease_timeout * 3)
        assert await ids(router) == ["w1"]
        assert router.discovery.vouched() == ["w1"]  # type: ignore[attr-defined]
        assert watch.take() == []

        await cut_off.discovery.register(info("w1", a1))  # heard from again: watchers re-sync
        await watch.wait_for(DiscoveryEvent("added", info("w1", a1)), timeout=2)
        assert router.discovery.vouched() == []  # type: ignore[attr-defined]
        watch.stop()
        await cut_off.close()
        await dead.close()


async def test_out_of_range_ttls_are_dropped(server: NatsServer, anyio_backend: str) -> None:
    from interlock.runtime.nats_discovery import Announcement, _encoder, announce_subject

    async with (
        await connect_runtime(server.url, FAST) as router,
        await connect_runtime(server.url, FAST) as liar,
    ):
        nc = liar.discovery._nc  # type: ignore[attr-defined]
        for i, ttl in enumerate([-1.0, float("nan"), float("inf"), 0.0, 1e9]):
            await nc.publish(
                announce_subject(f"bad{i}"),
                _encoder.encode(Announcement(info(f"bad{i}", "tcp://h:1/x"), ttl)),
            )
        await nc.flush()
        await asyncio.sleep(0.3)
        assert await ids(router) == []


async def test_a_vouched_lease_is_checked_again_every_ttl() -> None:
    alive = {"w1": True}
    asked: list[str] = []

    async def vouch(i: InstanceInfo) -> bool:
        asked.append(i.instance_id)
        return alive[i.instance_id]

    table = LeaseTable(vouch)
    table.refresh(info("w1", "tcp://h:1/w1"), 0.1)
    await asyncio.sleep(0.35)
    assert table.vouched() == ["w1"] and len(asked) >= 2
    alive["w1"] = False
    await asyncio.sleep(0.25)
    assert table.instances(ENDPOINT) == []
    table.close()
