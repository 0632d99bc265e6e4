"""vLLM's KV events into the router's block hashes (no vLLM needed: decoded batches by hand)."""

from __future__ import annotations

import pytest

from interlock.engine.vllm.events import Gap, Translator
from interlock.kvhash import hash_blocks
from interlock.protocol import AllBlocksCleared, BlockRemoved, BlockStored

BS = 4


def stored(hashes, parent, tokens, **extra):
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": tokens,
        "block_size": BS,
        "lora_id": None,
        "medium": "GPU",
        **extra,
    }


def removed(hashes, medium="GPU"):
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium}


TOKENS = list(range(100, 112))  # three blocks of 4


def test_stored_blocks_get_the_routers_hashes_across_batches():
    tr = Translator(BS)
    first = tr.feed(0, [stored([11, 12], None, TOKENS[:8])])
    second = tr.feed(1, [stored([13], 12, TOKENS[8:])])
    ours = hash_blocks(TOKENS, BS)
    assert first == [BlockStored(block_hashes=tuple(ours[:2]), parent_block_hash=None, block_size=BS)]
    assert second[0].block_hashes == (ours[2],)
    assert second[0].parent_block_hash == ours[1]
    assert tr.num_blocks == 3


def test_removed_names_our_hashes_and_forgets_them():
    tr = Translator(BS)
    tr.feed(0, [stored([11, 12, 13], None, TOKENS)])
    ours = hash_blocks(TOKENS, BS)
    assert tr.feed(1, [removed([13, 99])]) == [BlockRemoved(block_hashes=(ours[2],))]
    assert tr.feed(2, [removed([99])]) == []
    assert tr.num_blocks == 2


def test_a_block_after_an_unknown_parent_is_not_announced():
    tr = Translator(BS)
    assert tr.feed(0, [stored([13], 12, TOKENS[8:])]) == []
    assert tr.skipped == 1


@pytest.mark.parametrize(
    "extra",
    [
        {"lora_id": 3},
        {"lora_name": "a"},
        {"extra_keys": [("salt",)]},
        {"block_size": 8},
        {"token_ids": [1, 2]},
    ],
)
def test_blocks_whose_hash_is_more_than_plain_tokens_are_skipped(extra):
    tr = Translator(BS)
    assert tr.feed(0, [stored([11], None, TOKENS[:4], **extra)]) == []
    assert tr.skipped == 1 and tr.num_blocks == 0


def test_all_cleared_empties_the_mirror():
    tr = Translator(BS)
    tr.feed(0, [stored([11], None, TOKENS[:4])])
    assert tr.feed(1, [{"type": "AllBlocksCleared"}]) == [AllBlocksCleared()]
    assert tr.snapshot() == [AllBlocksCleared()]


def test_sequence_gaps_and_restarts():
    tr = Translator(BS)
    assert tr.check(0) is None
    tr.feed(0, [stored([11], None, TOKENS[:4])])
    assert tr.check(1) is None
    assert tr.check(5) == Gap(1, 5)
    # A new publisher (engine restarted) numbers from 0 again: the cache is empty there.
    assert tr.check(0) is None
    assert tr.feed(0, [])[0] == AllBlocksCleared()
    assert tr.num_blocks == 0 and tr.next_seq == 1
    tr.feed(1, [])
    with pytest.raises(ValueError):
        tr.check(1)


def test_reset_after_lost_events_tells_the_router_and_continues():
    tr = Translator(BS)
    tr.feed(0, [stored([11], None, TOKENS[:4])])
    assert tr.reset(7) == [AllBlocksCleared()]
    assert tr.next_seq == 7 and tr.resets == 1 and tr.num_blocks == 0


def test_snapshot_replays_the_mirror_parents_first():
    tr = Translator(BS)
    tr.feed(0, [stored([11, 12], None, TOKENS[:8]), stored([13], 12, TOKENS[8:])])
    tr.feed(1, [stored([21], None, [7, 7, 7, 7], medium="CPU")])
    cleared, *snap = tr.snapshot()
    assert cleared == AllBlocksCleared()
    ours = hash_blocks(TOKENS, BS)
    assert [e.block_hashes for e in snap] == [
        (ours[0],),
        (ours[1],),
        (ours[2],),
        (hash_blocks([7] * 4, BS)[0],),
    ]
    assert [e.parent_block_hash for e in snap[:3]] == [None, ours[0], ours[1]]
    assert snap[3].tier == "host"
    # Replaying the snapshot into a fresh router-side chain gives the same hashes.
    assert all(isinstance(e, BlockStored) for e in snap)


def test_tiers_are_kept_apart():
    tr = Translator(BS)
    tr.feed(0, [stored([11], None, TOKENS[:4]), stored([11], None, TOKENS[:4], medium="CPU")])
    out = tr.feed(1, [removed([11])])
    assert out == [BlockRemoved(block_hashes=(hash_blocks(TOKENS[:4], BS)[0],))]
    assert tr.num_blocks == 1
    assert tr.snapshot()[1].tier == "host"


def test_cached_tokens_follow_the_device_tier():
    tr = Translator(BS)
    tr.feed(0, [stored([11, 12], None, TOKENS[:8]), stored([21], None, TOKENS[:4], medium="CPU")])
    assert tr.cached_tokens(TOKENS) == 8  # the third block is not held
    assert tr.cached_tokens([1, 2, 3, 4, *TOKENS]) == 0  # another prefix
    tr.feed(1, [removed([12])])
    assert tr.cached_tokens(TOKENS) == 4
    tr.feed(2, [removed([11])])
    assert tr.cached_tokens(TOKENS) == 0  # the host-tier copy of block 0 is not the device's
    tr.feed(3, [stored([11], None, TOKENS[:4]), {"type": "AllBlocksCleared"}])
    assert tr.cached_tokens(TOKENS) == 0
