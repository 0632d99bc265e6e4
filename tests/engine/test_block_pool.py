from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from interlock import kvhash
from interlock.engine.block_pool import BlockPool
from interlock.protocol import AllBlocksCleared, BlockRemoved, BlockStored

BS = 2


def _cache_seq(pool: BlockPool, blocks: list[int], toks: list[int]) -> list[int]:
    hashes = kvhash.hash_blocks(toks, pool.block_size)
    pool.cache_blocks(blocks, hashes, 0, len(hashes))
    return hashes


def test_allocate_free_counts() -> None:
    pool = BlockPool(4, BS)
    a = pool.allocate(3)
    assert len(set(a)) == 3 and pool.num_free_blocks == 1 and pool.num_used_blocks == 3
    pool.free(a)
    assert pool.num_free_blocks == 4 and pool.num_used_blocks == 0
    pool.check_integrity()
    with pytest.raises(ValueError):
        pool.allocate(5)


def test_cached_blocks_survive_free_and_are_hit() -> None:
    pool = BlockPool(4, BS)
    blocks = pool.allocate(2)
    hashes = _cache_seq(pool, blocks, [1, 2, 3, 4])
    pool.free(reversed(blocks))
    assert pool.num_free_blocks == 4 and pool.num_cached_blocks == 2
    assert [pool.get_cached_block(h) for h in hashes] == blocks
    pool.touch(blocks)
    assert pool.num_used_blocks == 2 and pool.ref_cnt[blocks[0]] == 1
    pool.check_integrity()


def test_plain_free_blocks_go_before_cached_ones_and_lru_order() -> None:
    pool = BlockPool(4, BS)
    a, b = pool.allocate(1), pool.allocate(1)
    _cache_seq(pool, a, [1, 1])
    _cache_seq(pool, b, [2, 2])
    pool.free(b)
    pool.free(a)  # b freed first: least recently freed, evicted first
    first = pool.allocate(2)
    assert set(first).isdisjoint(a + b)  # the two uncached blocks go first
    pool.take_events()
    assert pool.allocate(1) == b
    assert pool.take_events() == [BlockRemoved(block_hashes=(kvhash.hash_blocks([2, 2], BS)[0],))]
    assert pool.allocate(1) == a
    pool.check_integrity()


def test_stored_events_carry_parent_and_hashes_only() -> None:
    pool = BlockPool(8, BS)
    blocks = pool.allocate(3)
    toks = [5, 6, 7, 8, 9, 10]
    hashes = kvhash.hash_blocks(toks, BS)
    pool.cache_blocks(blocks, hashes, 0, 1)
    pool.cache_blocks(blocks, hashes, 1, 3)
    assert pool.take_events() == [
        BlockStored(block_hashes=(hashes[0],), parent_block_hash=None, block_size=BS),
        BlockStored(block_hashes=tuple(hashes[1:]), parent_block_hash=hashes[0], block_size=BS),
    ]
    assert pool.take_events() == []


def test_duplicate_content_is_not_stored_twice() -> None:
    pool = BlockPool(8, BS)
    a, b = pool.allocate(2), pool.allocate(2)
    _cache_seq(pool, a, [1, 2, 3, 4])
    pool.take_events()
    _cache_seq(pool, b, [1, 2, 3, 4])
    assert pool.take_events() == []
    pool.free(b)
    assert pool.num_cached_blocks == 2
    pool.check_integrity()


def test_snapshot_lists_every_cached_block_parents_first() -> None:
    pool = BlockPool(8, BS)
    blocks = pool.allocate(3)
    hashes = _cache_seq(pool, blocks, [1, 2, 3, 4, 5, 6])
    snap = pool.snapshot()
    assert snap[0] == AllBlocksCleared()
    stored = [e for e in snap[1:] if isinstance(e, BlockStored)]
    assert [e.block_hashes[0] for e in stored] == hashes
    assert [e.parent_block_hash for e in stored] == [None, hashes[0], hashes[1]]


def test_reset_clears_hashes_and_emits_event() -> None:
    pool = BlockPool(4, BS)
    blocks = pool.allocate(2)
    _cache_seq(pool, blocks, [1, 2, 3, 4])
    pool.free(blocks[:1])
    pool.take_events()
    pool.reset_prefix_cache()
    assert pool.take_events() == [AllBlocksCleared()]
    assert pool.num_cached_blocks == 0
    pool.check_integrity()
    pool.free(blocks[1:])
    assert pool.num_free_blocks == 4
    pool.check_integrity()


# ---- property test: random allocate / cache / hit / free / evict / reset ----
class PoolMachine(RuleBasedStateMachine):
    """Holders model requests: each holds a list of blocks (one reference per entry)."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = BlockPool(12, BS)
        self.holders: list[tuple[list[int], list[int]]] = []

    def _held(self) -> set[int]:
        return {b for blocks, _ in self.holders for b in blocks}

    @rule(n=st.integers(1, 6), toks=st.lists(st.integers(0, 2), min_size=0, max_size=12))
    def allocate(self, n: int, toks: list[int]) -> None:
        if n > self.pool.num_free_blocks:
            with pytest.raises(ValueError):
                self.pool.allocate(n)
            return
        held = self._held()
        blocks = self.pool.allocate(n)
        assert not held & set(blocks), "handed out a block in use"
        assert len(set(blocks)) == n
        self.holders.append((blocks, toks[: n * BS]))

    @precondition(lambda self: self.holders)
    @rule(i=st.integers(0, 100))
    def cache(self, i: int) -> None:
        blocks, toks = self.holders[i % len(self.holders)]
        hashes = kvhash.hash_blocks(toks, BS)
        self.pool.cache_blocks(blocks, hashes, 0, min(len(hashes), len(blocks)))

    @rule(toks=st.lists(st.integers(0, 2), min_size=2, max_size=12))
    def hit(self, toks: list[int]) -> None:
        hits: list[int] = []
        for h in kvhash.hash_blocks(toks, BS):
            b = self.pool.get_cached_block(h)
            if b is None:
                break
            hits.append(b)
        if hits:
            self.pool.touch(hits)
            self.holders.append((hits, toks[: len(hits) * BS]))

    @precondition(lambda self: self.holders)
    @rule(i=st.integers(0, 100))
    def free(self, i: int) -> None:
        blocks, _ = self.holders.pop(i % len(self.holders))
        self.pool.free(reversed(blocks))

    @rule()
    def reset(self) -> None:
        self.pool.reset_prefix_cache()

    @invariant()
    def intact(self) -> None:
        self.pool.check_integrity()
        refs = [0] * self.pool.num_blocks
        for blocks, _ in self.holders:
            for b in blocks:
                refs[b] += 1
        assert refs == self.pool.ref_cnt
        assert self.pool.num_free_blocks + self.pool.num_used_blocks == self.pool.num_blocks

    def teardown(self) -> None:
        for blocks, _ in self.holders:
            self.pool.free(reversed(blocks))
        self.pool.check_integrity()
        assert self.pool.num_free_blocks == self.pool.num_blocks


PoolMachine.TestCase.settings = settings(max_examples=80, stateful_step_count=40, deadline=None)
TestPoolMachine = PoolMachine.TestCase


def test_cached_prefix_stops_at_the_first_miss_and_counts_the_free_ones() -> None:
    pool = BlockPool(8, 2, enable_caching=True)
    blocks = pool.allocate(3)
    pool.cache_blocks(blocks, [11, 12, 13], 0, 3)
    assert pool.cached_prefix([11, 12, 13, 14]) == blocks
    assert pool.cached_prefix([11, 99, 13]) == blocks[:1] and pool.cached_prefix([99, 11]) == []
    assert pool.num_cached_free(blocks) == 0
    pool.free(blocks[1:])
    assert pool.num_cached_free(blocks) == 2
