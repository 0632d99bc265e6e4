"""A worker's side of a router's KV pull (``protocol/kv_sync.py``): the ring of the batches it
published last (``KvEventLog``), and the endpoint that replays a router's gap from it or sends
the whole cache in bounded parts (``KvSyncServer``)."""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import AsyncIterator

import msgspec

from interlock.engine.serving import ServingEngine
from interlock.protocol.kv_sync import PART_BLOCKS, KvSyncHeader, KvSyncRequest, snapshot_parts
from interlock.runtime.interfaces import CallContext

RING_BATCHES = 4096
RING_BYTES = 8 << 20
"""The ring keeps at most this many batches and bytes (the oldest go first): a link down for a
few seconds on a busy worker is replayed, a longer one costs a snapshot."""

_encode = msgspec.msgpack.Encoder().encode
_decode_request = msgspec.msgpack.Decoder(KvSyncRequest).decode


class KvEventLog:
    """The last batches this worker published, encoded as they went out, by seq (contiguous:
    every batch is appended as it is numbered)."""

    def __init__(self, max_batches: int = RING_BATCHES, max_bytes: int = RING_BYTES) -> None:
        if max_batches < 1 or max_bytes < 1:
            raise ValueError("the ring needs room for a batch")
        self.max_batches, self.max_bytes = max_batches, max_bytes
        self._ring: deque[tuple[int, bytes]] = deque()
        self._bytes = 0
        self.last_seq = -1
        """The seq of the last batch appended (-1: none yet)."""

    def append(self, seq: int, payload: bytes) -> None:
        if seq != self.last_seq + 1:
            raise ValueError(f"batch {seq} after {self.last_seq}: the ring's seqs are contiguous")
        self._ring.append((seq, payload))
        self._bytes += len(payload)
        self.last_seq = seq
        while len(self._ring) > self.max_batches or (self._bytes > self.max_bytes and len(self._ring) > 1):
            self._bytes -= len(self._ring.popleft()[1])

    def since(self, seq: int | None) -> list[bytes] | None:
        """The batches after ``seq`` (-1: from the first), in order; None where the ring no
        longer holds them all, ``seq`` is None, or it is not one this worker published."""
        if seq is None or seq < -1 or seq > self.last_seq:
            return None
        if seq == self.last_seq:
            return []
        first = self._ring[0][0] if self._ring else self.last_seq + 1
        if seq + 1 < first:
            return None
        return [payload for _, payload in itertools.islice(self._ring, seq + 1 - first, None)]

    def __len__(self) -> int:
        return len(self._ring)

    @property
    def nbytes(self) -> int:
        return self._bytes


class KvSyncServer:
    """The ``kv_sync`` endpoint of one worker."""

    def __init__(self, engine: ServingEngine, log: KvEventLog, part_blocks: int = PART_BLOCKS) -> None:
        self.engine, self.log, self.part_blocks = engine, log, part_blocks
        self.replays = 0
        self.snapshots = 0

    async def handle(self, payload: bytes, ctx: CallContext) -> AsyncIterator[bytes]:
        req = _decode_request(payload)
        replay = self.log.since(req.since)
        if replay is not None:
            self.replays += 1
            yield _encode(KvSyncHeader(kind="replay", seq=self.log.last_seq, frames=len(replay)))
            for frame in replay:
                yield frame
            return
        as_of = self.log.last_seq  # read before the snapshot: every batch up to it is in it
        parts = snapshot_parts(await self.engine.kv_state(), self.part_blocks)
        self.snapshots += 1
        blocks = sum(p.blocks for p in parts)
        yield _encode(KvSyncHeader(kind="snapshot", seq=as_of, frames=len(parts), blocks=blocks))
        for part in parts:
            yield _encode(part)
