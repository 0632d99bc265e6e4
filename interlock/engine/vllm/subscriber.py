"""The I/O around ``events.Translator``: vLLM's KV event stream, read over ZMQ.

vLLM's publisher (in its engine core process) binds a PUB socket and a ROUTER socket for
replays on ``ipc://`` endpoints; this subscribes to the first and, when a batch arrives past the
next expected one, asks the second for the batches in between (one request: the first missing
sequence number, 8 bytes big-endian; answers ``[topic, seq, payload]`` each, then a ``-1``
sequence number). What the translator makes of each batch, in order, goes to ``publish``.
A batch older than the next expected one (a replay's duplicate) is dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import msgspec

from interlock.engine.vllm.events import Translator
from interlock.protocol import KVEvent

log = logging.getLogger(__name__)

TOPIC = b"kv"
END_SEQ = -1
REPLAY_TIMEOUT_S = 2.0
_batch_decoder = msgspec.msgpack.Decoder()


def decode_events(payload: bytes) -> list[dict[str, Any]]:
    """vLLM's batch ``[timestamp, [events], dp_rank]``: each event a map with a ``type`` tag."""
    batch = _batch_decoder.decode(payload)
    events = batch[1] if isinstance(batch, list) and len(batch) > 1 else []
    return [e for e in events if isinstance(e, dict)]


class EventSubscriber:
    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str,
        translator: Translator,
        publish: Callable[[list[KVEvent]], None],
    ) -> None:
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.translator = translator
        self.publish = publish

    async def run(self) -> None:
        """Until cancelled."""
        import zmq
        import zmq.asyncio

        sub = zmq.asyncio.Context.instance().socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, TOPIC)
        sub.connect(self.endpoint)
        try:
            while True:
                _topic, seq_b, payload = await sub.recv_multipart()
                await self.on_batch(int.from_bytes(seq_b, "big"), payload)
        finally:
            sub.close(linger=0)

    async def on_batch(self, seq: int, payload: bytes) -> None:
        tr = self.translator
        try:
            gap = tr.check(seq)
        except ValueError:
            log.debug("vLLM KV batch %d arrived again: dropped", seq)
            return
        if gap is not None:
            replayed = await self.replay(gap.first, gap.upto)
            if replayed is None:
                log.warning(
                    "vLLM KV events %d..%d lost: the router forgets this worker's blocks",
                    gap.first,
                    gap.upto - 1,
                )
                self.publish(tr.reset(seq))
            else:
                for rseq, rpayload in replayed:
                    self.publish(tr.feed(rseq, decode_events(rpayload)))
        self.publish(tr.feed(seq, decode_events(payload)))

    async def replay(self, first: int, upto: int) -> list[tuple[int, bytes]] | None:
        """Batches ``first`` .. ``upto - 1`` from vLLM's replay buffer, or None when it no
        longer holds them all (or does not answer within ``REPLAY_TIMEOUT_S``)."""
        import zmq
        import zmq.asyncio

        sock = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        sock.connect(self.replay_endpoint)
        got: list[tuple[int, bytes]] = []
        try:
            await sock.send_multipart((b"", first.to_bytes(8, "big")))
            while await sock.poll(int(REPLAY_TIMEOUT_S * 1000)):
                frames = await sock.recv_multipart()
                seq = int.from_bytes(frames[-2], "big", signed=True)
                if seq == END_SEQ:
                    break
                if first <= seq < upto:
                    got.append((seq, frames[-1]))
        finally:
            sock.close(linger=0)
        got.sort()
        if [s for s, _ in got] != list(range(first, upto)):
            return None
        return got
