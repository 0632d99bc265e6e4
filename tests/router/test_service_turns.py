"""A burst of worker messages does not take the event loop in one turn: the router service
gives other tasks (requests) their turn while it works through the queue."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from interlock.protocol import BlockStored, InstanceInfo, KVEventBatch, subjects
from interlock.router.service import RouterService
from interlock.runtime import InProcRegistry, RuntimeConfig, connect_runtime
from interlock.runtime.subscription import Subscription


@pytest.mark.timeout(60)
def test_a_queued_burst_of_kv_events_lets_other_tasks_run_while_it_is_applied() -> None:
    async def main() -> None:
        registry = InProcRegistry()
        rt = await connect_runtime(None, RuntimeConfig(), registry=registry)
        svc = RouterService(discovery=rt.discovery, requests=rt.requests, events=rt.events)
        info = InstanceInfo(
            instance_id="w", endpoint=subjects.GENERATE_ENDPOINT, model="m", address="inproc://w"
        )
        svc._add(info)  # known to the router, with no KV-sync endpoint: batches are applied as they come
        router = svc.routers["m"]
        sub = Subscription(subjects.KV_ALL)
        encode = msgspec.msgpack.Encoder().encode
        n = 5000
        for seq in range(n):  # queued before the loop gets to them: one burst
            ev = BlockStored(block_hashes=(seq + 1,), parent_block_hash=None)
            sub.deliver(
                subjects.kv("w"), encode(KVEventBatch(instance_id="w", seq=seq, timestamp=0.0, events=(ev,)))
            )
        ticks_during = 0
        done = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks_during
            while not done.is_set():
                await asyncio.sleep(0)
                if router.indexer.num_blocks("w") < n:
                    ticks_during += 1

        async def watch() -> None:
            while router.indexer.num_blocks("w") < n:
                await asyncio.sleep(0)
            done.set()

        consumer = asyncio.create_task(svc._on_kv(sub))
        await asyncio.wait_for(asyncio.gather(ticker(), watch()), 30)
        assert ticks_during >= 5  # the burst (tens of ms of work) was taken in many turns
        consumer.cancel()
        await sub.close()
        await rt.close()
        registry.leases.close()

    asyncio.run(main())
