from __future__ import annotations

from interlock.engine.block_pool import BlockPool
from interlock.engine.kv_cache_manager import KVCacheManager
from interlock.engine.request import Request
from interlock.protocol import SamplingParams

BS = 4


def _req(rid: str, prompt: list[int]) -> Request:
    return Request(rid, tuple(prompt), SamplingParams(), block_size=BS)


def _compute_all(kv: KVCacheManager, req: Request) -> None:
    assert kv.allocate_slots(req, req.num_tokens - req.num_computed_tokens) is not None
    req.num_computed_tokens = req.num_tokens
    kv.cache_full_blocks(req)


def test_allocate_covers_tokens_and_grows() -> None:
    kv = KVCacheManager(BlockPool(8, BS))
    req = _req("a", list(range(6)))
    assert len(kv.allocate_slots(req, 6) or []) == 2
    req.num_computed_tokens = 6
    assert kv.allocate_slots(req, 2) == []  # fits in the second block
    req.num_computed_tokens = 8
    assert len(kv.allocate_slots(req, 1) or []) == 1
    assert len(kv.block_table("a")) == 3
    kv.check_integrity()


def test_prefix_lookup_leaves_the_last_token_to_compute() -> None:
    kv = KVCacheManager(BlockPool(8, BS))
    first = _req("a", list(range(8)))
    _compute_all(kv, first)
    same = _req("b", list(range(8)))
    blocks, n = kv.get_computed_blocks(same)
    assert n == 4 and blocks == kv.block_table("a")[:1]  # 8 tokens cached, but one must be computed
    longer = _req("c", list(range(9)))
    blocks, n = kv.get_computed_blocks(longer)
    assert n == 8 and blocks == kv.block_table("a")
    other = _req("d", [9] + list(range(1, 9)))
    assert kv.get_computed_blocks(other) == ([], 0)


def test_hits_are_shared_and_freed_tail_first() -> None:
    pool = BlockPool(6, BS)
    kv = KVCacheManager(pool)
    a = _req("a", list(range(12)))
    _compute_all(kv, a)
    b = _req("b", list(range(12)) + [99])
    hits, n = kv.get_computed_blocks(b)
    assert kv.allocate_slots(b, b.num_tokens - n, hits, num_computed_tokens=n) is not None
    assert kv.block_table("b")[:3] == kv.block_table("a")
    assert [pool.ref_cnt[x] for x in kv.block_table("a")] == [2, 2, 2]
    kv.check_integrity()
    table = list(kv.block_table("a"))
    kv.free("b")
    kv.free("a")
    kv.check_integrity()
    # Tail first: the last block of the sequence is the first to be evicted.
    assert pool.allocate(4)[-1] == table[2]  # after the 3 plain free blocks


def test_watermark_only_at_admission() -> None:
    pool = BlockPool(10, BS)
    kv = KVCacheManager(pool, watermark=0.2)  # 2 blocks kept back
    big = _req("a", list(range(36)))  # 9 blocks
    assert kv.allocate_slots(big, 36, watermark=True) is None
    assert kv.allocate_slots(big, 32, watermark=True) is not None  # 8 blocks, leaves 2
    big.num_computed_tokens = 32
    assert kv.allocate_slots(big, 4) is not None  # running requests may dig into the watermark
    kv.check_integrity()


def test_cached_hits_in_free_queue_count_against_free_space() -> None:
    pool = BlockPool(3, BS)
    kv = KVCacheManager(pool)
    a = _req("a", list(range(8)))
    _compute_all(kv, a)
    kv.free("a")
    b = _req("b", list(range(8)) + [1, 2, 3, 4, 5])  # 13 tokens: 4 blocks, 2 hit
    hits, n = kv.get_computed_blocks(b)
    assert n == 8
    assert kv.allocate_slots(b, 5, hits, num_computed_tokens=n) is None  # needs 2 more, 1 left
    assert kv.allocate_slots(b, 4, hits, num_computed_tokens=n) is not None
    kv.check_integrity()


def test_allocate_for_remote_covers_the_prompt() -> None:
    pool = BlockPool(4, BS)
    kv = KVCacheManager(pool, watermark=0.25)
    req = _req("r", list(range(10)))
    assert kv.allocate_for_remote(req, watermark=True) is not None
    assert len(kv.block_table("r")) == 3
    assert kv.allocate_for_remote(_req("s", [1]), watermark=True) is None  # watermark: 1 kept
    kv.check_integrity()
