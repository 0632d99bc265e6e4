"""A host-memory KV tier for the simulated workers: capacity and load time, nothing else.

Mirrors the engine's (``interlock.engine.tiers``): blocks a worker's pool evicts are stored
here (LRU, oldest out first); a prefix lookup that continues here after the pool's hits loads
those blocks instead of computing them. One ``SimTiers`` may be given to several workers: the
tier shared by the workers of a host, which is also written through (every computed block is
stored at once, as the engine does for a shared tier).

Load time: ``load_s_per_block`` per block, added to the step that admits the request (the
engine overlaps loads with other requests' steps and holds no batch slot, so this is
pessimistic for TTFT; capacity, hits and evictions are exact for the policy).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(slots=True)
class SimTiers:
    capacity: int
    """Host tier blocks (shared by every worker given this object)."""
    load_s_per_block: float = 1e-4
    write_through: bool = False
    lru: OrderedDict[int, None] = field(default_factory=OrderedDict)
    stores: int = 0
    evictions: int = 0
    hit_blocks: int = 0

    def __post_init__(self) -> None:
        if self.capacity < 1 or self.load_s_per_block < 0:
            raise ValueError("a host tier needs capacity >= 1 and load_s_per_block >= 0")

    def offload(self, hashes: Sequence[int]) -> tuple[list[int], list[int]]:
        """Blocks a device pool evicted come here; returns (stored, evicted from here)."""
        lru = self.lru
        stored: list[int] = []
        evicted: list[int] = []
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)
                continue
            lru[h] = None
            stored.append(h)
            if len(lru) > self.capacity:
                evicted.append(lru.popitem(last=False)[0])
        self.stores += len(stored)
        self.evictions += len(evicted)
        return stored, evicted

    def lookup(self, hashes: Sequence[int]) -> int:
        """Leading ``hashes`` held here."""
        n = 0
        for h in hashes:
            if h not in self.lru:
                break
            n += 1
        return n

    def load(self, hashes: Sequence[int]) -> float:
        """Count a load of ``hashes`` (all held here); returns its modelled seconds."""
        for h in hashes:
            self.lru.move_to_end(h)
        self.hit_blocks += len(hashes)
        return len(hashes) * self.load_s_per_block
