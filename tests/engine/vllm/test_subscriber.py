"""vLLM's own KV event publisher (its ZMQ PUB socket and replay buffer) into the subscriber:
batches published before the subscriber connected are fetched from the replay socket, in
order; a restarted publisher (numbering from 0 again) clears what the router knew. Needs vLLM
(its publisher) and pyzmq; skipped without them."""

from __future__ import annotations

import asyncio

import pytest

from interlock.engine.vllm.events import Translator
from interlock.engine.vllm.subscriber import EventSubscriber
from interlock.kvhash import hash_blocks
from interlock.protocol import AllBlocksCleared, BlockStored, KVEvent

kv_events = pytest.importorskip("vllm.distributed.kv_events", reason="vLLM is not installed")

BS = 4
TOKENS = list(range(200, 216))


def stored(i: int, parent: int | None) -> object:
    return kv_events.BlockStored(
        block_hashes=[1000 + i], parent_block_hash=parent, token_ids=TOKENS[i * BS : (i + 1) * BS],
        block_size=BS, lora_id=None, medium="GPU", lora_name=None,
    )  # fmt: skip


def batch(*events: object) -> object:
    return kv_events.KVEventBatch(ts=0.0, events=list(events))


@pytest.mark.timeout(60)
def test_missed_batches_are_replayed_in_order_and_a_restart_clears(tmp_path) -> None:
    endpoint, replay = f"ipc://{tmp_path}/kv", f"ipc://{tmp_path}/replay"

    async def main() -> None:
        got: list[KVEvent] = []
        pub = kv_events.ZmqEventPublisher(0, endpoint=endpoint, replay_endpoint=replay, topic="kv")
        try:
            # Published before anyone listens: lost on the PUB socket, kept for replay.
            pub.publish(batch(stored(0, None)))
            pub.publish(batch(stored(1, 1000)))
            await asyncio.sleep(0.3)
            sub = EventSubscriber(endpoint, replay, Translator(BS), got.extend)
            task = asyncio.create_task(sub.run())
            await asyncio.sleep(0.3)  # connected
            pub.publish(batch(stored(2, 1001)))
            async with asyncio.timeout(10):
                while len(got) < 3:
                    await asyncio.sleep(0.02)
            ours = hash_blocks(TOKENS, BS)
            assert [e.block_hashes for e in got if isinstance(e, BlockStored)] == [(h,) for h in ours[:3]]
            assert sub.translator.next_seq == 3
        finally:
            pub.shutdown()
        # A new engine process: a new publisher on the same endpoints, numbering from 0.
        pub = kv_events.ZmqEventPublisher(0, endpoint=endpoint, replay_endpoint=replay, topic="kv")
        try:
            await asyncio.sleep(0.5)  # the subscriber reconnects
            pub.publish(batch(stored(0, None)))
            async with asyncio.timeout(10):
                while len(got) < 5:
                    await asyncio.sleep(0.02)
            assert got[3] == AllBlocksCleared()
            assert got[4].block_hashes == (ours[0],)
            assert sub.translator.num_blocks == 1
        finally:
            pub.shutdown()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())
