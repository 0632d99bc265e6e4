"""Discovery behaviour, the same for every implementation (see conftest.make_runtime)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import aclosing

import anyio
import pytest

from interlock.errors import ConfigError
from interlock.protocol import InstanceInfo
from interlock.runtime import DiscoveryEvent

from .conftest import FAST, MakeRuntime

pytestmark = pytest.mark.anyio


def info(namespace: str, instance_id: str, endpoint: str = "generate") -> InstanceInfo:
    return InstanceInfo(
        instance_id=instance_id,
        endpoint=f"{namespace}.worker.{endpoint}",
        model="m",
        address=f"inproc://{instance_id}",
    )


async def next_event(events: AsyncIterator[DiscoveryEvent], timeout: float = 2.0) -> DiscoveryEvent:
    with anyio.fail_after(timeout):
        return await anext(events)


async def test_register_is_seen_by_another_client(make_runtime: MakeRuntime, namespace: str) -> None:
    worker, frontend = await make_runtime(), await make_runtime()
    await worker.discovery.register(info(namespace, "w1"))
    await worker.discovery.register(info(namespace, "w0"))
    await worker.discovery.register(info(namespace, "other", endpoint="health"))
    with anyio.fail_after(2):
        while len(await frontend.discovery.instances(f"{namespace}.worker.generate")) < 2:
            await anyio.sleep(0.01)
    found = await frontend.discovery.instances(f"{namespace}.worker.generate")
    assert [i.instance_id for i in found] == ["w0", "w1"]
    assert found[1] == info(namespace, "w1")


async def test_newcomer_sees_existing_instances_on_connect(make_runtime: MakeRuntime, namespace: str) -> None:
    worker = await make_runtime()
    await worker.discovery.register(info(namespace, "w1"))
    await anyio.sleep(0.05)  # let the registration reach the server before the newcomer asks
    frontend = await make_runtime()
    # No waiting for a heartbeat: the start-up query answered already.
    assert [i.instance_id for i in await frontend.discovery.instances(f"{namespace}.worker.generate")] == [
        "w1"
    ]


async def test_watch_yields_snapshot_then_changes(make_runtime: MakeRuntime, namespace: str) -> None:
    worker, router = await make_runtime(), await make_runtime()
    await worker.discovery.register(info(namespace, "w1"))
    await anyio.sleep(0.05)
    async with aclosing(router.discovery.watch(f"{namespace}.worker.generate")) as events:
        assert await next_event(events) == DiscoveryEvent("added", info(namespace, "w1"))
        await worker.discovery.register(info(namespace, "w2", endpoint="health"))  # other endpoint
        await worker.discovery.register(info(namespace, "w3"))
        assert await next_event(events) == DiscoveryEvent("added", info(namespace, "w3"))
        await worker.discovery.unregister("w1")  # it said goodbye: a graceful removal
        assert await next_event(events) == DiscoveryEvent("removed", info(namespace, "w1"), graceful=True)


async def test_heartbeats_keep_an_instance_past_its_timeout(
    make_runtime: MakeRuntime, namespace: str
) -> None:
    worker, router = await make_runtime(), await make_runtime()
    await worker.discovery.register(info(namespace, "w1"))
    await anyio.sleep(FAST.lease_timeout * 2.5)
    assert len(await router.discovery.instances(f"{namespace}.worker.generate")) == 1


async def test_silent_instance_leaves_within_timeout(make_runtime: MakeRuntime, namespace: str) -> None:
    worker, router = await make_runtime(), await make_runtime()
    await worker.discovery.register(info(namespace, "w1"))
    async with aclosing(router.discovery.watch(f"{namespace}.worker.generate")) as events:
        assert (await next_event(events)).kind == "added"
        worker.discovery.abandon()  # type: ignore[attr-defined]
        started = time.monotonic()
        event = await next_event(events, timeout=FAST.lease_timeout * 3)
        waited = time.monotonic() - started
    assert event == DiscoveryEvent("removed", info(namespace, "w1"))
    # Left after the lease ran out, not before (heartbeats stopped at most one interval ago).
    assert FAST.lease_timeout - FAST.heartbeat_interval - 0.05 <= waited
    assert await router.discovery.instances(f"{namespace}.worker.generate") == []


async def test_close_unregisters(make_runtime: MakeRuntime, namespace: str) -> None:
    worker, router = await make_runtime(), await make_runtime()
    await worker.discovery.register(info(namespace, "w1"))
    async with aclosing(router.discovery.watch()) as events:
        while (await next_event(events)).instance.instance_id != "w1":
            pass
        await worker.close()
        while (event := await next_event(events)).instance.instance_id != "w1":
            pass
    assert event.kind == "removed"


async def test_register_validates_names(make_runtime: MakeRuntime, namespace: str) -> None:
    runtime = await make_runtime()
    with pytest.raises(ConfigError):
        await runtime.discovery.register(info(namespace, "w.1"))
    with pytest.raises(ConfigError):
        await runtime.discovery.register(
            InstanceInfo(instance_id="w1", endpoint="not-three-parts", model="m")
        )
