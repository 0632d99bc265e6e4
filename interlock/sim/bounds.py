"""Upper bounds on a replay's prefix-cache hit ratio, from the requests alone (no workers).

Both walk the requests in arrival order and count, per request, the leading prompt blocks some
earlier request left in the cache (at least one token of each prompt is always computed):

- the *infinite-cache* bound: every block ever seen stays, so only the trace limits reuse;
- the *pooled-cache* bound: one LRU cache of ``capacity_blocks`` (all workers' blocks together)
  shared by every request, so it adds the capacity limit but no split between workers. A
  router that sends each prefix where it is cached approaches it; the gap to the infinite bound
  is what capacity costs, the gap from the replay's hit ratio to it what splitting the cache
  over workers costs. A request's blocks are touched tail first, so a prefix is always more
  recent than its continuations and eviction takes continuations first (as the engine's block
  pool frees a sequence's tail first).

The walks over every block of a trace (2.3 M for the conversation trace) are the slow part in
Python: both run in ``csrc/pooled_lru.c`` (``sim.native``, built once per machine; the infinite bound
is the pooled walk with room for every block).
The Python walks stay the reference, and the fallback where keys do not fit 64 bits unsigned, no
compiler is found or ``INTERLOCK_CPU_KERNELS=0``; tests check both give the same figures.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Container, Iterable, Sequence

import numpy as np

from interlock.sim import native
from interlock.sim.trace import SimRequest


def _hit_ratio(
    requests: Iterable[SimRequest],
    block_size: int,
    cached: Container[int],
    keep: Callable[[tuple[int, ...]], None],
) -> float:
    """The walk both bounds share: each request, in arrival order, hits its leading blocks in
    ``cached`` (all but its last token at most), then ``keep`` puts its blocks there."""
    hit = total = 0
    for r in sorted(requests, key=lambda r: r.arrival_s):
        n = 0
        for h in r.block_hashes:
            if h not in cached:
                break
            n += 1
        hit += max(min(n * block_size, r.prompt_tokens - 1), 0)
        total += r.prompt_tokens
        keep(r.block_hashes)
    return hit / total if total else 0.0


def _ratio(reqs: Sequence[SimRequest], block_size: int, leading: np.ndarray) -> float:
    """The hit ratio from each request's count of leading cached blocks (as ``_hit_ratio``)."""
    prompt = np.fromiter((r.prompt_tokens for r in reqs), dtype=np.int64, count=len(reqs))
    total = int(prompt.sum())
    hit = int(np.maximum(np.minimum(leading * block_size, prompt - 1), 0).sum())
    return hit / total if total else 0.0


def _flat(reqs: Sequence[SimRequest]) -> tuple[np.ndarray, np.ndarray] | None:
    """Every request's block hashes in one uint64 array and each request's offsets into it, or
    None where a hash does not fit (then the Python walks)."""
    lengths = np.fromiter((len(r.block_hashes) for r in reqs), dtype=np.int64, count=len(reqs))
    offsets = np.zeros(len(reqs) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    try:
        keys = np.fromiter(
            itertools.chain.from_iterable(r.block_hashes for r in reqs),
            dtype=np.uint64,
            count=int(offsets[-1]),
        )
    except (OverflowError, ValueError, TypeError):
        return None
    return keys, offsets


def infinite_cache_hit_ratio(requests: Iterable[SimRequest], block_size: int) -> float:
    """Share of prompt tokens one infinite cache could serve: the pooled walk with room for
    every block there is (nothing is ever evicted)."""
    return _bound(sorted(requests, key=lambda r: r.arrival_s), block_size, None)


def infinite_cache_hit_ratio_walk(requests: Iterable[SimRequest], block_size: int) -> float:
    """``infinite_cache_hit_ratio`` block by block (the reference)."""
    seen: set[int] = set()
    return _hit_ratio(requests, block_size, seen, seen.update)


def pooled_cache_hit_ratio(requests: Iterable[SimRequest], block_size: int, capacity_blocks: int) -> float:
    """Share of prompt tokens one shared LRU cache of ``capacity_blocks`` blocks could serve."""
    return _bound(sorted(requests, key=lambda r: r.arrival_s), block_size, capacity_blocks)


def cache_bounds(
    requests: Iterable[SimRequest], block_size: int, capacity_blocks: int
) -> tuple[float, float]:
    """``(infinite_cache_hit_ratio, pooled_cache_hit_ratio)``, the requests sorted and their
    hashes gathered once for both."""
    reqs = sorted(requests, key=lambda r: r.arrival_s)
    flat = _flat(reqs) if native.load_bounds() is not None else None
    return _bound(reqs, block_size, None, flat), _bound(reqs, block_size, capacity_blocks, flat)


def _bound(
    reqs: Sequence[SimRequest],
    block_size: int,
    capacity_blocks: int | None,
    flat: tuple[np.ndarray, np.ndarray] | None = None,
) -> float:
    """One bound over requests sorted by arrival (``capacity_blocks`` None: the infinite
    cache): by the compiled walk where it runs, else block by block."""
    leading = _leading_compiled(reqs, capacity_blocks, flat)
    if leading is not None:
        return _ratio(reqs, block_size, leading)
    if capacity_blocks is None:
        return infinite_cache_hit_ratio_walk(reqs, block_size)
    return pooled_cache_hit_ratio_walk(reqs, block_size, capacity_blocks)


def _leading_compiled(
    reqs: Sequence[SimRequest],
    capacity_blocks: int | None,
    flat: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray | None:
    """Each request's leading cached blocks by the compiled walk (``capacity_blocks`` None: as
    many as there are blocks; ``flat``: ``_flat(reqs)`` where the caller has it), or None where
    it cannot run (module note)."""
    lib = native.load_bounds()
    if lib is None:
        return None
    flat = flat if flat is not None else _flat(reqs)
    if flat is None:
        return None
    keys, offsets = flat
    capacity = len(keys) if capacity_blocks is None else capacity_blocks
    leading = np.empty(len(reqs), dtype=np.int64)
    if lib.pooled_lru_leading(
        keys.ctypes.data, offsets.ctypes.data, len(reqs), capacity, leading.ctypes.data
    ):
        raise MemoryError(f"the cache bound's LRU of {capacity:,} blocks")
    return leading


def pooled_cache_hit_ratio_walk(
    requests: Iterable[SimRequest], block_size: int, capacity_blocks: int
) -> float:
    """``pooled_cache_hit_ratio`` block by block (the reference)."""
    lru: OrderedDict[int, None] = OrderedDict()

    def keep(hashes: tuple[int, ...]) -> None:
        for h in reversed(hashes[:capacity_blocks]):
            lru[h] = None
            lru.move_to_end(h)
        while len(lru) > capacity_blocks:
            lru.popitem(last=False)

    return _hit_ratio(requests, block_size, lru, keep)
