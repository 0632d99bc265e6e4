"""A router pulling a worker's KV state: the gap it missed, or the whole cache.

Served on the request plane at ``metadata["kv_sync_address"]`` of the worker's
``InstanceInfo`` (``engine/kv_sync.py``), called by the router (``router/kv_sync.py``). The
router says the last batch it applied (``KvSyncRequest.since``, None for the whole cache); the
reply stream opens with a
``KvSyncHeader`` and then:

- ``replay``: the worker still holds every batch after ``since`` in its ring of recent
  batches: those batches, one frame each, exactly as they were published (``KVEventBatch``).
- ``snapshot``: it does not (or ``since`` is None): the whole cache as ``KvSnapshotPart`` frames,
  bounded in size, block hashes only (8 bytes a block, packed, where a published
  ``BlockStored`` per block took about 150). The snapshot reflects at least every batch up to
  ``KvSyncHeader.seq`` (and possibly some after it): the router applies it as of that seq and
  then the live batches after it, which is exact because every KV event sets a block's state
  (stored, removed, all cleared) rather than changing it.

Nothing here goes through the NATS server (the request plane is TCP between the two): a
frontend that joins a fleet pulls its snapshots a few workers at a time, with no slow-consumer
limit to run into.

A router replica (a frontend, a standalone router) serves the same snapshots of what its own
index holds, per worker, at ``KV_REPLICA_ENDPOINT`` (registered in discovery under the router's
id): a frontend that joins while another runs copies its index from it and asks the workers
for nothing but the gaps (``router/kv_replica.py``). The reply is a ``snapshot`` as of the
replica's last applied batch from that worker, or ``missing`` (no frames) where the replica
holds no whole state of it (not known, or still being pulled).
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable, Mapping, Sequence

import msgspec

from interlock.protocol.events import BlockStored, KVEvent

KV_SYNC_ENDPOINT = "interlock.worker.kv_sync"
KV_REPLICA_ENDPOINT = "interlock.router.kv_replica"
KV_LOOKUP_ENDPOINT = "interlock.router.kv_lookup"
"""Served by every replica with an index beside ``kv_replica``; its address is in the replica's
registration (``metadata["kv_lookup_address"]``)."""
REPLICA_ID_PREFIX = "router-"
"""A replica registers as ``router-<router id>``, and only such registrations are asked: no
worker login may announce an id with this prefix (``nats_permissions.worker_permissions``), so
where workers have logins of their own none can pose as a replica and feed a new frontend a
false index."""
KV_SYNC_KINDS = ("replay", "snapshot", "missing")


class KvSyncRequest(msgspec.Struct, frozen=True, kw_only=True):
    since: int | None
    """The seq of the last batch the router applied from this worker (-1: the state before the
    first); None: the whole cache."""


class KvReplicaRequest(msgspec.Struct, frozen=True, kw_only=True):
    instance_id: str
    """The worker whose state the replica is asked for (always whole: a replica keeps no ring)."""


class KvLookupRequest(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """A frontend without an index of its own (``--kv-index remote``) asks a router replica
    which workers hold a prefix of one request's blocks (``router/kv_lookup.py``)."""

    model: str
    hashes: list[int]
    """The request's block hashes, in order."""


class KvLookupReply(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """The workers holding a prefix of the request's blocks (the others hold none)."""

    workers: list[str]
    device: list[int]
    """Leading blocks each of ``workers`` holds in its device pool."""
    lower: list[int] | None = None
    """Blocks right after that prefix each holds in a lower tier (host, disk); None: the
    replica knows of no lower tier anywhere."""


class KvSyncHeader(msgspec.Struct, frozen=True, kw_only=True):
    kind: str
    """``replay``, ``snapshot`` or (a replica's answer) ``missing`` (``KV_SYNC_KINDS``)."""
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
    hashes: bytes
    """The block hashes packed, unsigned 64-bit little-endian, 8 bytes a block
    (``pack_hashes``): read into an array with no Python int made for any of them, every one
    in the index's domain by its type (as msgpack ints they took 9 bytes a block and about
    100 ns of the router's loop to decode and check)."""

    @property
    def blocks(self) -> int:
        return len(self.hashes) // 8


PART_BLOCKS = 16384
"""Block hashes per snapshot part (128 KiB)."""


def pack_hashes(hashes: Sequence[int]) -> bytes:
    """Block hashes as ``KvSnapshotPart.hashes`` (OverflowError: one is not a 64-bit unsigned int)."""
    packed = array("Q", hashes)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


def unpack_hashes(data: bytes, into: array[int] | None = None) -> array[int]:
    """``KvSnapshotPart.hashes`` as an array of unsigned 64-bit ints (appended to ``into``);
    ValueError where ``data`` is not a whole number of hashes."""
    if len(data) % 8:
        raise ValueError(f"packed block hashes of {len(data)} bytes: not a multiple of 8")
    out = into if into is not None else array("Q")
    start = len(out)
    out.frombytes(data)
    if sys.byteorder == "big":
        tail = out[start:]
        tail.byteswap()
        out[start:] = tail
    return out


def snapshot_parts(
    by_tier: Mapping[str, Sequence[int]], part_blocks: int = PART_BLOCKS
) -> list[KvSnapshotPart]:
    """A whole state's block hashes by tier as parts of at most ``part_blocks`` hashes."""
    return [
        KvSnapshotPart(tier=tier, hashes=pack_hashes(hashes[i : i + part_blocks]))
        for tier, hashes in by_tier.items()
        for i in range(0, len(hashes), part_blocks)
    ]


def stored_by_tier(events: Iterable[KVEvent]) -> dict[str, list[int]]:
    """A cache snapshot's ``BlockStored`` events (``ServingEngine.kv_snapshot``: after an
    ``AllBlocksCleared``, nothing removed) as block hashes by tier."""
    by_tier: dict[str, list[int]] = {}
    for ev in events:
        if isinstance(ev, BlockStored):
            by_tier.setdefault(ev.tier, []).extend(ev.block_hashes)
    return by_tier
