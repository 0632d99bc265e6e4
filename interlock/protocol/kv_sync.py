"""A router pulling a worker's KV state: the gap it missed, or the whole cache.

Served on the request plane at ``metadata["kv_sync_address"]`` of the worker's
``InstanceInfo`` (``engine/kv_sync.py``), called by the router (``router/kv_sync.py``). The
router says the last batch it applied (``KvSyncRequest.since``, None for the whole cache); the
reply stream opens with a
``KvSyncHeader`` and then:

- ``replay``: the worker still holds every batch after ``since`` in its ring of recent
  batches: those batches, one frame each, exactly as they were published (``KVEventBatch``).
- ``snapshot``: it does not (or ``since`` is None): the whole cache as ``KvSnapshotPart`` frames,
  bounded in size, block hashes only (about 9 bytes a block in msgpack, where a published
  ``BlockStored`` per block took about 150). The snapshot reflects at least every batch up to
  ``KvSyncHeader.seq`` (and possibly some after it): the router applies it as of that seq and
  then the live batches after it, which is exact because every KV event sets a block's state
  (stored, removed, all cleared) rather than changing it.

Nothing here goes through the NATS server (the request plane is TCP between the two): a
frontend that joins a fleet pulls its snapshots a few workers at a time, with no slow-consumer
limit to run into.
"""

from __future__ import annotations

import msgspec

KV_SYNC_ENDPOINT = "interlock.worker.kv_sync"
KV_SYNC_KINDS = ("replay", "snapshot")


class KvSyncRequest(msgspec.Struct, frozen=True, kw_only=True):
    since: int | None
    """The seq of the last batch the router applied from this worker (-1: the state before the
    first); None: the whole cache."""


class KvSyncHeader(msgspec.Struct, frozen=True, kw_only=True):
    kind: str
    """``replay`` or ``snapshot`` (``KV_SYNC_KINDS``)."""
    seq: int
    """replay: the seq of the last batch replayed; snapshot: the seq it is taken as of (-1:
    before any batch)."""
    frames: int
    """Frames that follow."""
    blocks: int = 0
    """snapshot: block hashes in its parts, every tier."""


class KvSnapshotPart(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    tier: str
    """``device``, ``host`` or ``disk`` (``protocol.events.TIERS``)."""
    hashes: list[int]
