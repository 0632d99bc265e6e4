from __future__ import annotations

import pytest

from interlock.sim.bounds import infinite_cache_hit_ratio, pooled_cache_hit_ratio
from interlock.sim.trace import SimRequest


def test_infinite_cache_bound() -> None:
    reqs = [
        SimRequest("a", 0.0, 100, 1, (1, 2, 3)),
        SimRequest("b", 1.0, 100, 1, (1, 2, 9)),
        SimRequest("c", 2.0, 100, 1, (1, 2, 3)),
    ]
    # b reuses 2 blocks (20 tokens), c reuses 3 blocks (30 tokens), at block size 10
    assert infinite_cache_hit_ratio(reqs, 10) == 50 / 300


# Block size 4, 8-token prompts (2 blocks each, at most 7 tokens reusable): a = (1, 2), then
# b = (3, 4), then c = (1, 2) again. The LRU order after a is [2, 1] (tail first, so the prefix is
# the most recent); b adds 4 then 3.
TINY = [
    SimRequest("a", 0.0, 8, 1, (1, 2)),
    SimRequest("b", 1.0, 8, 1, (3, 4)),
    SimRequest("c", 2.0, 8, 1, (1, 2)),
]


@pytest.mark.parametrize(
    ("capacity", "hit_tokens"),
    [
        (2, 0),  # b evicts 2 and 1: c finds nothing
        (3, 4),  # b evicts 2 only: c finds block 1 (4 tokens)
        (4, 7),  # everything stays: c's 8 tokens minus the one always computed
        (1000, 7),
    ],
)
def test_pooled_cache_bound_by_hand(capacity: int, hit_tokens: int) -> None:
    assert pooled_cache_hit_ratio(TINY, 4, capacity) == hit_tokens / 24


def test_pooled_bound_never_exceeds_the_infinite_one() -> None:
    reqs = [SimRequest(f"r{i}", float(i), 64, 1, tuple(range(i % 5, i % 5 + 8))) for i in range(40)]
    inf = infinite_cache_hit_ratio(reqs, 8)
    assert [pooled_cache_hit_ratio(reqs, 8, c) <= inf for c in (1, 4, 8, 16)] == [True] * 4
    assert pooled_cache_hit_ratio(reqs, 8, 10_000) == inf


def random_requests(seed: int, n: int = 300) -> list[SimRequest]:
    """Prompts over a small tree of shared prefixes (so both hits and evictions happen), a few
    empty, keys near 2**64 included."""
    import random

    rng = random.Random(seed)
    roots = [tuple(rng.randrange(1 << 64) for _ in range(rng.randrange(0, 6))) for _ in range(8)]
    out = []
    for i in range(n):
        blocks = roots[rng.randrange(len(roots))] + tuple(
            rng.randrange(40) for _ in range(rng.randrange(0, 12))
        )
        prompt = len(blocks) * 4 + rng.randrange(0, 4)
        out.append(SimRequest(f"r{i}", rng.random() * 100, max(prompt, 1), 1, blocks))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_the_fast_bounds_equal_the_block_by_block_walks(seed) -> None:
    from interlock.sim import bounds, native

    reqs = random_requests(seed)
    assert bounds.infinite_cache_hit_ratio(reqs, 4) == bounds.infinite_cache_hit_ratio_walk(reqs, 4)
    assert native.load_bounds() is not None  # this machine has a compiler: the C walk is tested
    for capacity in (0, 1, 3, 17, 60, 10_000):
        fast = bounds.pooled_cache_hit_ratio(reqs, 4, capacity)
        assert fast == bounds.pooled_cache_hit_ratio_walk(reqs, 4, capacity), capacity


def test_both_bounds_at_once_equal_each_alone() -> None:
    from interlock.sim import bounds

    reqs = random_requests(7)
    assert bounds.cache_bounds(reqs, 4, 17) == (
        bounds.infinite_cache_hit_ratio_walk(reqs, 4),
        bounds.pooled_cache_hit_ratio_walk(reqs, 4, 17),
    )
