"""Per-request block tables on top of the block pool.

The manager answers three questions for the scheduler: how much of a request's prefix is already
cached (``get_computed_blocks``), can it get slots for N more tokens (``allocate_slots``, with a
watermark of free blocks kept back at admission), and which blocks became full and can be
cached (``cache_full_blocks``); with KV tiers below the pool, how many blocks after the cached
prefix a lower tier could load (``lower_tier_blocks``). It frees a request's blocks tail first, so the end of a sequence
is evicted before its shared prefix.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from interlock.engine.block_pool import BlockPool
from interlock.engine.request import Request


class TierLookup(Protocol):
    def lookup(self, hashes: Sequence[int]) -> int:
        """How many leading ``hashes`` a tier below the pool can load now."""
        ...


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    def __init__(self, pool: BlockPool, *, watermark: float = 0.0, tiers: TierLookup | None = None) -> None:
        self.pool = pool
        self.tiers = tiers
        self.block_size = pool.block_size
        self.watermark_blocks = int(watermark * pool.num_blocks)
        self._blocks: dict[str, list[int]] = {}
        self._num_cached: dict[str, int] = {}
        """Blocks of each request already offered to the cache (a prefix of its table)."""

    def block_table(self, request_id: str) -> list[int]:
        """The request's blocks in order (the live list: valid until the next allocation/free)."""
        return self._blocks.get(request_id, [])

    def has_blocks(self, request_id: str) -> bool:
        return request_id in self._blocks

    @property
    def num_requests(self) -> int:
        return len(self._blocks)

    def get_computed_blocks(self, req: Request) -> tuple[list[int], int]:
        """Longest cached prefix of ``req``: (blocks, tokens). Never the whole sequence: at least
        the last token must be computed so that a next token can be sampled."""
        if not self.pool.enable_caching:
            return [], 0
        max_blocks = (req.num_tokens - 1) // self.block_size
        hits = self.pool.cached_prefix(req.block_hashes[:max_blocks])
        return hits, len(hits) * self.block_size

    def lower_tier_blocks(self, req: Request, num_device_blocks: int) -> int:
        """Blocks right after the first ``num_device_blocks`` (the pool's hits) that a lower
        tier holds; as for hits, never up to the last token."""
        if self.tiers is None or not self.pool.enable_caching:
            return 0
        max_blocks = (req.num_tokens - 1) // self.block_size
        if num_device_blocks >= max_blocks:
            return 0
        return self.tiers.lookup(req.block_hashes[num_device_blocks:max_blocks])

    def allocate_slots(
        self,
        req: Request,
        num_new_tokens: int,
        computed_blocks: Sequence[int] = (),
        *,
        num_computed_tokens: int | None = None,
        watermark: bool = False,
    ) -> list[int] | None:
        """Make the request's blocks cover ``num_computed + num_new_tokens`` tokens.

        ``computed_blocks`` (prefix hits, only for a request with no blocks yet) are taken with
        one more reference. Returns the newly allocated blocks, or None (nothing changed) if the
        pool cannot give them while keeping ``watermark_blocks`` free when ``watermark``.
        """
        rid = req.request_id
        blocks = self._blocks.get(rid)
        computed = req.num_computed_tokens if num_computed_tokens is None else num_computed_tokens
        have = (len(blocks) if blocks else 0) + len(computed_blocks)
        need = -(-(computed + num_new_tokens) // self.block_size) - have
        if need <= 0 and blocks is not None and not computed_blocks:
            return []  # the common decode step: the last block still has room
        pool = self.pool
        # Hits sitting in cached-free count as free now but stop being free once touched.
        revived = pool.num_cached_free(computed_blocks)
        available = pool.num_free_blocks - revived - (self.watermark_blocks if watermark else 0)
        if need > available:
            return None
        if blocks is None:
            blocks = self._blocks[rid] = []
            self._num_cached[rid] = len(computed_blocks)
        if computed_blocks:
            pool.touch(computed_blocks)
            blocks.extend(computed_blocks)
        new = pool.allocate(need) if need > 0 else []
        blocks.extend(new)
        return new

    def allocate_for_remote(self, req: Request, *, watermark: bool) -> list[int] | None:
        """Blocks for the whole prompt of a request whose KV another worker computed (no prefix
        lookup: the transfer fills every block). None if the pool cannot give them now."""
        return self.allocate_slots(req, req.num_prompt_tokens, num_computed_tokens=0, watermark=watermark)

    def cache_full_blocks(self, req: Request) -> None:
        """Offer the blocks that became full of computed KV to the prefix cache."""
        rid = req.request_id
        start = self._num_cached.get(rid)
        if start is None:
            return
        n_full = req.num_computed_tokens // self.block_size
        if n_full > start:
            self.pool.cache_blocks(self._blocks[rid], req.block_hashes, start, n_full)
            self._num_cached[rid] = n_full

    def free(self, request_id: str) -> None:
        """Release all blocks of the request, tail first (evicted first)."""
        blocks = self._blocks.pop(request_id, None)
        self._num_cached.pop(request_id, None)
        if blocks:
            self.pool.free(reversed(blocks))

    def check_integrity(self) -> None:
        """Pool invariants plus: every reference is held by exactly one request's table."""
        self.pool.check_integrity()
        counts = [0] * self.pool.num_blocks
        for blocks in self._blocks.values():
            for b in blocks:
                counts[b] += 1
        if counts != self.pool.ref_cnt:
            bad = next(b for b, c in enumerate(counts) if c != self.pool.ref_cnt[b])
            raise AssertionError(
                f"kv cache: block {bad} held {counts[bad]} times, ref_cnt {self.pool.ref_cnt[bad]}"
            )
