"""Which index shard keeps a worker's KV state (``routing.kv_shard``, ``--kv-shard I/N``).

A sharded KV index splits the fleet's workers over N index processes by rendezvous hashing of
their ids: each worker goes to the shard whose (worker, shard) hash is highest, so a worker's
shard never depends on which other workers exist, and changing N moves only ~1/N of them. Each
shard ingests only its workers' KV events and state; a router asks every shard once per request
and joins the answers (disjoint by worker: ``kv_lookup.KvLookupClient``). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import xxhash

from interlock.deploy import parse_shard

__all__ = ["Shard", "parse_shard", "shard_of"]


@lru_cache(maxsize=1 << 16)
def shard_of(instance_id: str, count: int) -> int:
    """The shard of ``count`` that keeps ``instance_id``'s KV state."""
    if count <= 1:
        return 0
    key = instance_id.encode()
    return max(range(count), key=lambda s: xxhash.xxh3_64_intdigest(key, seed=s))


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count`` (``count`` 1: the whole index)."""

    index: int = 0
    count: int = 1

    @property
    def whole(self) -> bool:
        return self.count == 1

    @property
    def label(self) -> str:
        return f"{self.index}/{self.count}"

    def owns(self, instance_id: str) -> bool:
        return self.count == 1 or shard_of(instance_id, self.count) == self.index
