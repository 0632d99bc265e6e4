"""NATS discovery subscribes to announcements only in a process that reads the table.

A worker only registers: it must not receive every other worker's heartbeats (N workers would
cost the server N² deliveries). The table starts on the first ``instances()`` or ``watch()``,
whose start-up query still finds instances that registered earlier. Heartbeats here are 5 s
apart, so whatever is learnt within 2 s came from the query or a reconnect's re-announcement.
nats-server's ``/connz`` shows each connection's subscriptions by the name it connected with.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Iterator
from contextlib import aclosing

import anyio
import pytest

from interlock.protocol import InstanceInfo
from interlock.runtime import DiscoveryEvent, NatsServer, Runtime, RuntimeConfig, connect_runtime
from interlock.runtime.nats_discovery import ANNOUNCE, BYE, QUERY, announce_subject
from interlock.runtime.subscription import Subscription
from tests.e2e.conftest import free_port

pytestmark = pytest.mark.anyio
SLOW = RuntimeConfig(
    heartbeat_interval=5.0, lease_timeout=25.0, connect_timeout=1.0, peer_timeout=1.0, discovery_sync_s=0.2
)
LEARN_S = 2.0
"""Well under a heartbeat interval."""


@pytest.fixture(scope="module")
def server() -> Iterator[NatsServer]:
    with NatsServer(monitor_port=free_port()) as server:
        yield server


def info(endpoint: str, instance_id: str) -> InstanceInfo:
    return InstanceInfo(
        instance_id=instance_id, endpoint=endpoint, model="m", address=f"tcp://h:1/{instance_id}"
    )


async def connect(server: NatsServer, name: str) -> Runtime:
    return await connect_runtime(server.url, SLOW, name=name)


async def subscriptions(server: NatsServer) -> dict[str, list[str]]:
    """Each named connection's subscribed subjects (one entry per subscription)."""

    def get() -> dict[str, list[str]]:
        url = f"http://127.0.0.1:{server.monitor_port}/connz?subs=1"
        with urllib.request.urlopen(url, timeout=5) as r:
            conns = json.load(r)["connections"]
        return {c.get("name", ""): c.get("subscriptions_list", []) for c in conns}

    return await asyncio.to_thread(get)


async def ids_within(runtime: Runtime, endpoint: str, want: list[str]) -> None:
    with anyio.fail_after(LEARN_S):
        while [i.instance_id for i in await runtime.discovery.instances(endpoint)] != want:
            await asyncio.sleep(0.02)


async def silent(sub: Subscription, seconds: float) -> bool:
    with anyio.move_on_after(seconds):
        await anext(sub)
        return False
    return True


async def drain(sub: Subscription) -> None:
    while not await silent(sub, 0.2):
        pass


async def test_a_registrar_hears_no_announcements_while_a_reader_hears_every_one(
    server: NatsServer, namespace: str, anyio_backend: str
) -> None:
    endpoint = f"{namespace}.worker.generate"
    async with await connect(server, f"{namespace}-a") as a, await connect(server, f"{namespace}-b") as b:
        await a.discovery.register(info(endpoint, "wa"))
        await b.discovery.register(info(endpoint, "wb"))
        async with await connect(server, f"{namespace}-reader") as reader:
            await ids_within(reader, endpoint, ["wa", "wb"])
            subs = await subscriptions(server)
            assert subs[f"{namespace}-reader"].count(announce_subject("*")) == 1
            for registrar in (f"{namespace}-a", f"{namespace}-b"):
                assert QUERY in subs[registrar]  # it answers the reader's query
                assert not [s for s in subs[registrar] if s.startswith((ANNOUNCE, BYE))]
            assert a.discovery.vouched() == []
        await b.discovery.unregister("wb")  # a bye, published without a table
    async with await connect(server, f"{namespace}-late") as late:
        assert await late.discovery.instances(endpoint) == []  # both left: a bye, then close's


async def test_a_first_watch_learns_earlier_registrations_and_first_callers_share_one_start(
    server: NatsServer, namespace: str, anyio_backend: str
) -> None:
    endpoint = f"{namespace}.worker.generate"
    async with await connect(server, f"{namespace}-w") as registrar:
        await registrar.discovery.register(info(endpoint, "w1"))
        await registrar.discovery.register(info(endpoint, "w2"))
        async with await connect(server, f"{namespace}-watcher") as watcher:
            watch = watcher.discovery.watch(endpoint)
            async with aclosing(watch):
                with anyio.fail_after(LEARN_S):
                    first, _ = await asyncio.gather(anext(watch), watcher.discovery.instances(endpoint))
                    seen = [first]
                    while len(seen) < 2:
                        seen.append(await anext(watch))
                assert seen == [DiscoveryEvent("added", info(endpoint, i)) for i in ("w1", "w2")]
            subs = await subscriptions(server)
            assert subs[f"{namespace}-watcher"].count(announce_subject("*")) == 1


async def test_close_ends_a_start_under_way(server: NatsServer, namespace: str, anyio_backend: str) -> None:
    runtime = await connect(server, f"{namespace}-closing")
    watch = runtime.discovery.watch()
    listing = asyncio.ensure_future(runtime.discovery.instances(f"{namespace}.worker.generate"))
    first = asyncio.ensure_future(anext(watch, None))
    await asyncio.sleep(0.01)  # both wait for the start (discovery_sync_s)
    await runtime.close()
    with anyio.fail_after(LEARN_S):
        assert await listing == [] and await first is None


async def test_a_reconnect_re_announces_own_instances_and_asks_only_once_the_table_started(
    server: NatsServer, namespace: str, anyio_backend: str
) -> None:
    endpoint = f"{namespace}.worker.generate"
    async with (
        await connect(server, f"{namespace}-worker") as worker,
        await connect(server, f"{namespace}-observer") as observer,
    ):
        await worker.discovery.register(info(endpoint, "w1"))
        announced = await observer.events.subscribe(announce_subject("w1"))
        queried = await observer.events.subscribe(QUERY)
        assert worker.link is not None

        worker.link.lost("test: the link dropped")
        worker.link.restored()
        with anyio.fail_after(LEARN_S):
            await anext(announced)  # before the next heartbeat: the rejoin announced it
        assert await silent(queried, SLOW.discovery_sync_s * 2)  # no table: nothing to ask

        assert [i.instance_id for i in await worker.discovery.instances(endpoint)] == ["w1"]
        with anyio.fail_after(LEARN_S):
            await anext(queried)  # the start's query (sent twice), which w1 answers
        await drain(queried)
        await drain(announced)
        worker.link.lost("test: the link dropped again")
        worker.link.restored()
        with anyio.fail_after(LEARN_S):
            await anext(announced)
            await anext(queried)  # the table has started: the rejoin asks too
        assert [i.instance_id for i in await worker.discovery.instances(endpoint)] == ["w1"]
