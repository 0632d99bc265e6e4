"""LeaseTable: expiry, and suspend/resume around an outage of our own."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest

from interlock.protocol import InstanceInfo
from interlock.runtime import DiscoveryEvent
from interlock.runtime.leases import LeaseTable

pytestmark = pytest.mark.anyio
TTL = 0.2


def info(instance_id: str, address: str = "tcp://h:1/k") -> InstanceInfo:
    return InstanceInfo(instance_id=instance_id, endpoint="n.worker.generate", model="m", address=address)


class Seen:
    """Everything a watch yields, collected by a task (cancelling ``anext`` would end the watch)."""

    def __init__(self, table: LeaseTable) -> None:
        self.events: list[DiscoveryEvent] = []
        self._task = asyncio.create_task(self._collect(table.watch(None)))

    async def _collect(self, events: AsyncGenerator[DiscoveryEvent, None]) -> None:
        async for event in events:
            self.events.append(event)

    async def taken(self) -> list[DiscoveryEvent]:
        """The events seen since the last call (the table emits synchronously: one yield is enough)."""
        await asyncio.sleep(0.01)
        found, self.events = self.events, []
        return found


async def test_silent_instance_expires_after_its_ttl() -> None:
    table = LeaseTable()
    table.refresh(info("w1"), TTL)
    await asyncio.sleep(TTL / 2)
    assert table.instances("n.worker.generate") == [info("w1")]
    await asyncio.sleep(TTL)
    assert table.instances("n.worker.generate") == []
    table.close()


async def test_suspended_table_expires_nothing() -> None:
    table = LeaseTable()
    table.refresh(info("w1"), TTL)
    table.suspend()
    table.refresh(info("w2"), TTL)  # our own registration, made during the outage
    await asyncio.sleep(TTL * 3)
    assert [i.instance_id for i in table.instances("n.worker.generate")] == ["w1", "w2"]
    table.close()


async def test_resume_gives_a_full_ttl_then_expires_the_unheard() -> None:
    table = LeaseTable()
    table.refresh(info("w1"), TTL)
    table.suspend()
    await asyncio.sleep(TTL * 2)
    table.resume()
    await asyncio.sleep(TTL / 2)
    assert table.instances("n.worker.generate") == [info("w1")]
    await asyncio.sleep(TTL)
    assert table.instances("n.worker.generate") == []
    table.close()


async def test_first_refresh_after_resume_is_added_again_once() -> None:
    table = LeaseTable()
    table.refresh(info("w1"), TTL)
    seen = Seen(table)
    assert await seen.taken() == [DiscoveryEvent("added", info("w1"))]
    table.refresh(info("w1"), TTL)  # an ordinary heartbeat: nothing to tell
    assert await seen.taken() == []
    table.suspend()
    table.resume()
    assert await seen.taken() == []  # resuming alone says nothing: it waits to hear from w1
    table.refresh(info("w1"), TTL)
    assert await seen.taken() == [DiscoveryEvent("added", info("w1"))]
    table.refresh(info("w1"), TTL)  # confirmed again: back to silence
    assert await seen.taken() == []
    table.close()


async def test_changed_registration_after_resume_is_replaced() -> None:
    table = LeaseTable()
    table.refresh(info("w1"), TTL)
    seen = Seen(table)
    assert await seen.taken() == [DiscoveryEvent("added", info("w1"))]
    table.suspend()
    table.resume()
    table.refresh(info("w1", address="tcp://h:2/k"), TTL)  # it restarted during the outage
    assert await seen.taken() == [
        DiscoveryEvent("removed", info("w1")),
        DiscoveryEvent("added", info("w1", address="tcp://h:2/k")),
    ]
    table.close()
