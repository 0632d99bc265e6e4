"""A router replica's copy of its index, served to another replica (``protocol/kv_sync.py``,
``KV_REPLICA_ENDPOINT``): a frontend that starts while another runs copies each worker's state
from it instead of asking the worker, so a second frontend costs the fleet nothing but the gaps.

Chosen over a durable stream of every KV event (NATS JetStream with snapshots in its object
store, as Dynamo can) because the state a new replica needs is already held, current and
compact, by every live one; a stream would store every event of the fleet on the NATS server
to serve the rare join (``docs/scale.md`` has the figures).

``KvReplicaServer`` answers for one worker at a time: a ``snapshot`` of what the index holds of
it as of its last applied batch (``KvIndexer.export``), or ``missing`` where the index has no
whole state of it. The asking side is ``KvSync`` (``router/kv_sync.py``), which tries a replica
before the worker for a whole state and falls back to the worker on ``missing`` or a failure.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import msgspec

from interlock.protocol.kv_sync import PART_BLOCKS, KvReplicaRequest, KvSyncHeader, snapshot_parts
from interlock.runtime.interfaces import CallContext

Export = Callable[[str], "tuple[int, dict[str, list[int]]] | None"]
"""A worker's whole state in this replica's index: (seq, block hashes by tier), or None."""

_encode = msgspec.msgpack.Encoder().encode
_decode_request = msgspec.msgpack.Decoder(KvReplicaRequest).decode


class KvReplicaServer:
    """The ``kv_replica`` endpoint of one router service."""

    def __init__(self, export: Export, part_blocks: int = PART_BLOCKS) -> None:
        self._export = export
        self.part_blocks = part_blocks
        self.served = 0
        """Snapshots sent to other replicas."""
        self.missing = 0
        """Asks answered ``missing``."""

    async def handle(self, payload: bytes, ctx: CallContext) -> AsyncIterator[bytes]:
        req = _decode_request(payload)
        state = self._export(req.instance_id)
        if state is None:
            self.missing += 1
            yield _encode(KvSyncHeader(kind="missing", seq=-1, frames=0))
            return
        seq, tiers = state
        parts = snapshot_parts(tiers, self.part_blocks)
        self.served += 1
        blocks = sum(len(h) for h in tiers.values())
        yield _encode(KvSyncHeader(kind="snapshot", seq=seq, frames=len(parts), blocks=blocks))
        for part in parts:
            yield _encode(part)
