"""Per-worker NATS logins: a worker publishes only as itself and reads no one's KV events.

Each test plays a compromised worker that holds a valid (confined) login of its own."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import anyio
import msgspec
import nats
import pytest

from interlock.protocol import InstanceInfo, subjects
from interlock.runtime import NatsServer, RuntimeConfig, connect_runtime, generate_auth
from interlock.runtime.nats_discovery import Announcement, announce_subject, bye_subject
from interlock.runtime.nats_permissions import nats_config_users, worker_permissions, worker_user
from interlock.runtime.nats_server import PREFIX, _identity, remove_stale_dirs
from interlock.runtime.subscription import Subscription

pytestmark = pytest.mark.anyio

CFG = RuntimeConfig(heartbeat_interval=0.1, lease_timeout=0.5, connect_timeout=1.0, discovery_sync_s=0.05)
ENDPOINT = "ns.worker.generate"
ADMIN = generate_auth()
WA, WB = worker_user("wa"), worker_user("wb")


@pytest.fixture(scope="module")
def server() -> Iterator[NatsServer]:
    with NatsServer(auth=ADMIN, users=(WA, WB)) as s:
        yield s


def info(instance_id: str) -> InstanceInfo:
    return InstanceInfo(instance_id=instance_id, endpoint=ENDPOINT, model="m", address="tcp://h:1/k")


async def seen(rt, instance_id: str, wait_s: float = 0.6) -> bool:  # type: ignore[no-untyped-def]
    await asyncio.sleep(wait_s)
    return instance_id in [i.instance_id for i in await rt.discovery.instances(ENDPOINT)]


PROBE = b"probe"


async def live(publisher, sub: Subscription, subject: str) -> None:  # type: ignore[no-untyped-def]
    """Publish probes until one arrives: nats-server can drop what another connection publishes
    in the first moments after a subscription, even after a flush (tests/runtime/test_events.py)."""
    with anyio.fail_after(3):
        while True:
            await publisher.events.publish(subject, PROBE)
            with anyio.move_on_after(0.1):
                while (await sub.__anext__())[1] != PROBE:
                    pass
                return


async def test_a_worker_registers_and_reports_as_itself(server: NatsServer, anyio_backend: str) -> None:
    router = await connect_runtime(server.url, replace(CFG, nats_auth=ADMIN))
    worker = await connect_runtime(server.url, replace(CFG, nats_auth=WA.auth))
    try:
        kv = await router.events.subscribe(subjects.KV_ALL)
        await worker.discovery.register(info("wa"))
        await live(worker, kv, subjects.kv("wa"))
        await worker.events.publish(subjects.kv("wa"), b"own")
        with anyio.fail_after(3):
            while (item := await kv.__anext__())[1] == PROBE:
                pass
            assert item == (subjects.kv("wa"), b"own")
        assert await seen(router, "wa")
        await worker.discovery.unregister("wa")
        assert not await seen(router, "wa", 0.2)
    finally:
        await worker.close()
        await router.close()


async def test_a_worker_cannot_speak_for_another(server: NatsServer, anyio_backend: str) -> None:
    """Registering, reporting or saying bye as ``wb`` with ``wa``'s login reaches no one."""
    router = await connect_runtime(server.url, replace(CFG, nats_auth=ADMIN))
    honest = await connect_runtime(server.url, replace(CFG, nats_auth=WB.auth))
    evil = await connect_runtime(server.url, replace(CFG, nats_auth=WA.auth))
    try:
        kv = await router.events.subscribe(subjects.KV_ALL)
        load = await router.events.subscribe(subjects.LOAD_ALL)
        await live(honest, kv, subjects.kv("wb"))  # else a drop would pass for a refusal
        await live(honest, load, subjects.load("wb"))
        await evil.discovery.register(info("wb"))  # announced on wb's subject: refused by the server
        await evil.events.publish(subjects.kv("wb"), b"forged kv")
        await evil.events.publish(subjects.load("wb"), b"forged load")
        assert not await seen(router, "wb")
        # wa's own subjects with a payload naming wb: dropped by the subscriber
        await evil.discovery.unregister("wb")
        forged = msgspec.msgpack.encode(Announcement(info("wb"), 5.0))
        nc = await nats.connect(server.url, user=WA.user, password=WA.password)
        await nc.publish(announce_subject("wa"), forged)
        await honest.discovery.register(info("wb"))
        assert await seen(router, "wb")
        await nc.publish(bye_subject("wa"), b"wb")  # a bye for wb on wa's subject
        await nc.publish(bye_subject("wb"), b"wb")  # and on wb's: not wa's to publish
        assert await seen(router, "wb")
        assert [i.instance_id for i in await router.discovery.instances(ENDPOINT)] == ["wb"]
        await nc.close()
        with anyio.move_on_after(0.3):
            while (await kv.__anext__())[1] == PROBE:
                pass
            pytest.fail("a forged KV batch reached the router")
        with anyio.move_on_after(0.1):
            while (await load.__anext__())[1] == PROBE:
                pass
            pytest.fail("a forged load report reached the router")
    finally:
        await evil.close()
        await honest.close()
        await router.close()


async def test_a_worker_reads_no_ones_kv_events(server: NatsServer, anyio_backend: str) -> None:
    """The sniffer, as an insider: wa subscribes to every KV and load subject and hears nothing."""
    sniffer = await connect_runtime(server.url, replace(CFG, nats_auth=WA.auth))
    victim = await connect_runtime(server.url, replace(CFG, nats_auth=WB.auth))
    try:
        kv = await sniffer.events.subscribe(subjects.KV_ALL)
        load = await sniffer.events.subscribe(subjects.LOAD_ALL)
        await asyncio.sleep(0.1)
        await victim.events.publish(subjects.kv("wb"), b"my password is hunter2")
        await victim.events.publish(subjects.load("wb"), b"load")
        for sub in (kv, load):
            with anyio.move_on_after(0.3):
                await sub.__anext__()
                pytest.fail("a confined worker read another worker's events")
    finally:
        await victim.close()
        await sniffer.close()


async def test_a_login_added_to_a_running_server_works_at_once(anyio_backend: str) -> None:
    with NatsServer(auth=ADMIN) as s:
        late = worker_user("late")
        await asyncio.to_thread(s.add_users, (late,))
        rt = await connect_runtime(s.url, replace(CFG, nats_auth=late.auth))
        await rt.close()
        s.restart()  # a restarted server keeps it
        rt = await connect_runtime(s.url, replace(CFG, nats_auth=late.auth))
        await rt.close()


def test_the_permissions_name_only_the_workers_own_subjects() -> None:
    p = worker_permissions("w7")
    assert subjects.kv("w7") in p.publish and subjects.load("w7") in p.publish
    assert not any(x in (subjects.KV_ALL, subjects.LOAD_ALL, ">") for x in p.publish + p.subscribe)
    assert "interlock.kv.w7" not in p.subscribe
    block = nats_config_users([worker_user("w7")])
    assert '"interlock.kv.w7"' in block and "authorization" in block
    with pytest.raises(Exception, match="instance_id"):
        worker_permissions("a.b")  # a dot would widen the subjects


def test_a_worker_hosting_more_models_may_speak_for_each_of_them() -> None:
    p = worker_permissions("w7", also=("w7-m1",))
    for i in ("w7", "w7-m1"):
        assert subjects.kv(i) in p.publish and subjects.load(i) in p.publish
        assert subjects.resync(i) in p.subscribe
    assert subjects.kv("w8") not in p.publish


def test_stale_folders_of_killed_servers_are_removed(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale, live, foreign = tmp_path / f"{PREFIX}a", tmp_path / f"{PREFIX}b", tmp_path / f"{PREFIX}c"
    for folder in (stale, live, foreign):
        folder.mkdir()
    (stale / "owner").write_text(f"{dead.pid} 1")
    (live / "owner").write_text(_identity(os.getpid()))
    assert remove_stale_dirs(str(tmp_path)) == [stale]
    assert not stale.exists() and live.exists() and foreign.exists()
