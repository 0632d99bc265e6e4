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
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Container, Iterable

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


def infinite_cache_hit_ratio(requests: Iterable[SimRequest], block_size: int) -> float:
    """Share of prompt tokens one infinite cache could serve."""
    seen: set[int] = set()
    return _hit_ratio(requests, block_size, seen, seen.update)


def pooled_cache_hit_ratio(requests: Iterable[SimRequest], block_size: int, capacity_blocks: int) -> float:
    """Share of prompt tokens one shared LRU cache of ``capacity_blocks`` blocks could serve."""
    lru: OrderedDict[int, None] = OrderedDict()

    def keep(hashes: tuple[int, ...]) -> None:
        for h in reversed(hashes[:capacity_blocks]):
            lru[h] = None
            lru.move_to_end(h)
        while len(lru) > capacity_blocks:
            lru.popitem(last=False)

    return _hit_ratio(requests, block_size, lru, keep)
