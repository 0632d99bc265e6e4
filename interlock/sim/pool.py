"""Block accounting of the simulated worker: the engine's block pool and KV cache manager
(``engine/block_pool.py``, ``engine/kv_cache_manager.py``) with counts instead of block ids.

What decides hits and evictions is kept exactly: a block is in use (referenced), cached-free
(carries a key, unreferenced, evictable in LRU order) or plain free; allocation takes plain
free blocks first and only then evicts the least recently freed cached block; a request frees
its blocks tail first; one block per key (a second block computed with the same content stays
unkeyed and becomes plain free when released). Which physical block is which does not matter
for any figure, so blocks are only counted, and a cached block is known by its key.

Keys are the prompt's block hashes (``SimRequest.block_hashes``); a block past them (the last
partial prompt block filled by outputs, then output blocks) gets a negative key unique to its
request: like the engine's hash of generated tokens, it can only ever match that same request
again (after a preemption), and it is never published.

Invariant (``check``): plain + cached-free + in use == num_blocks.

With a host tier below (``tiers``, ``sim.tiers``), evicted keys go there, and with a tier that
is written through (shared by a host's workers) every stored key too, each published with
``tier="host"``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from interlock.protocol.events import BlockRemoved, BlockStored, KVEvent
from interlock.sim import native
from interlock.sim.tiers import SimTiers


class DictMap:
    """The pool's keys in Python: ``ref`` (key -> references) and ``lru`` (cached-free keys,
    least recently freed first). The reference for ``csrc/simpool.c``'s ``Pool``, which has
    these methods and gives the same results (``sim.native``); the fallback where it cannot be
    built."""

    def __init__(self, capacity: int) -> None:
        self.ref: dict[int, int] = {}
        self.lru: OrderedDict[int, None] = OrderedDict()

    @property
    def num_lru(self) -> int:
        return len(self.lru)

    @property
    def num_ref(self) -> int:
        return len(self.ref)

    def contains(self, key: int) -> bool:
        return key in self.ref or key in self.lru

    def prefix(self, keys: Sequence[int]) -> int:
        ref, lru = self.ref, self.lru
        n = 0
        for k in keys:
            if k not in ref and k not in lru:
                break
            n += 1
        return n

    def revived(self, keys: Sequence[int]) -> int:
        lru = self.lru
        return sum(1 for k in keys if k in lru)

    def touch(self, keys: Sequence[int]) -> int:
        ref, lru = self.ref, self.lru
        revived = 0
        for k in keys:
            if k in lru:
                del lru[k]
                ref[k] = 1
                revived += 1
            else:
                ref[k] += 1
        return revived

    def evict(self, n: int) -> list[int]:
        lru = self.lru
        removed = []
        for _ in range(n):
            k, _v = lru.popitem(last=False)
            if k >= 0:
                removed.append(k)
        return removed

    def store_run(self, keys: Sequence[int]) -> tuple[list[int], list[int]]:
        ref, lru = self.ref, self.lru
        stored, published = [], []
        for key in keys:
            if key in ref or key in lru:
                continue
            ref[key] = 1
            stored.append(key)
            if key >= 0:
                published.append(key)
        return stored, published

    def release(self, keys: Sequence[int]) -> int:
        ref, lru = self.ref, self.lru
        pop = ref.pop
        freed = 0
        for k in reversed(keys):
            c = pop(k)
            if c == 1:
                lru[k] = None
                freed += 1
            else:
                ref[k] = c - 1
        return freed

    def keys(self) -> list[int]:
        return [k for k in (*self.ref, *self.lru) if k >= 0]

    def counts(self) -> tuple[int, int, int]:
        assert not (self.ref.keys() & self.lru.keys())
        return len(self.ref), len(self.lru), sum(c - 1 for c in self.ref.values())


class SimPool:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        watermark: float = 0.01,
        tiers: SimTiers | None = None,
        compiled: bool = True,
    ) -> None:
        self.tiers = tiers
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.watermark_blocks = int(watermark * num_blocks)
        """As ``KVCacheManager``: kept free when admitting while something runs."""
        module = native.load() if compiled else None
        self.map: DictMap = module.Pool(num_blocks) if module is not None else DictMap(num_blocks)
        """Keyed blocks: in use (with their references) and cached-free in LRU order."""
        self.plain = num_blocks
        self.used = 0
        """Blocks with a reference (keyed or not)."""
        self.events: list[KVEvent] = []
        self._stored: list[int] = []

    @property
    def free(self) -> int:
        """Blocks an allocation can get now (plain + evictable)."""
        return self.plain + self.map.num_lru

    def cached(self, key: int) -> bool:
        return self.map.contains(key)

    def prefix(self, keys: Sequence[int]) -> int:
        """Leading ``keys`` that are cached."""
        return self.map.prefix(keys)

    def revived(self, keys: Sequence[int]) -> int:
        """Of these cached keys, how many are cached-free (taking them uses up free blocks)."""
        return self.map.revived(keys)

    def touch(self, keys: Sequence[int]) -> None:
        self.used += self.map.touch(keys)

    def allocate(self, n: int) -> None:
        """``n`` unkeyed blocks in use; evicts cached-free ones once plain ones run out."""
        assert n <= self.free, (n, self.free)
        take = min(n, self.plain)
        self.plain -= take
        if n > take:
            removed = self.map.evict(n - take)
            if removed:
                self._flush_stored()
                self.events.append(BlockRemoved(block_hashes=tuple(removed)))
                if self.tiers is not None:
                    self._to_host(removed)
        self.used += n

    def store(self, key: int) -> bool:
        """A block in use became full of computed KV: give it ``key`` unless another block
        already has it (then it stays unkeyed, as in the engine). True if stored."""
        return bool(self.store_run((key,)))

    def store_run(self, keys: Sequence[int]) -> list[int]:
        """``store`` each of ``keys`` in order; returns those stored."""
        stored, published = self.map.store_run(keys)
        self._stored += published
        return stored

    def release(self, keyed: Sequence[int], unkeyed: int) -> None:
        """Drop one reference on each block of a request: ``keyed`` in table order (freed
        tail first, so a sequence's end is evicted before its prefix) and ``unkeyed`` more."""
        freed = self.map.release(keyed)
        self.plain += unkeyed
        self.used -= unkeyed + freed

    def has_events(self) -> bool:
        """Events are waiting for ``take_events``."""
        return bool(self.events or self._stored)

    def take_events(self) -> list[KVEvent]:
        self._flush_stored()
        events, self.events = self.events, []
        return events

    def _flush_stored(self) -> None:
        if self._stored:
            stored, self._stored = self._stored, []
            self.events.append(
                BlockStored(block_hashes=tuple(stored), parent_block_hash=None, block_size=self.block_size)
            )
            if self.tiers is not None and self.tiers.write_through:
                self._to_host(stored)

    def _to_host(self, keys: list[int]) -> None:
        assert self.tiers is not None
        stored, dropped = self.tiers.offload(keys)
        if stored:
            self.events.append(
                BlockStored(
                    block_hashes=tuple(stored),
                    parent_block_hash=None,
                    block_size=self.block_size,
                    tier="host",
                )
            )
        if dropped:
            self.events.append(BlockRemoved(block_hashes=tuple(dropped), tier="host"))

    def keys(self) -> list[int]:
        """Every published key now cached (for a re-sync snapshot)."""
        return self.map.keys()

    def extra_refs(self) -> int:
        """References beyond the first on keyed blocks (blocks shared by requests)."""
        return self.map.counts()[2]

    def check(self) -> None:
        refs, lru, _ = self.map.counts()
        assert self.plain >= 0 and self.used >= refs
        assert self.plain + lru + self.used == self.num_blocks
