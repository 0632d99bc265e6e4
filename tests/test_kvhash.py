import xxhash
from hypothesis import given
from hypothesis import strategies as st

from interlock import kvhash


def test_hash_is_xxh3_of_parent_and_tokens_with_documented_seed():
    tokens = list(range(16))
    expected = xxhash.xxh3_64(
        (0).to_bytes(8, "little") + b"".join(t.to_bytes(4, "little") for t in tokens), seed=0x1A7E10C4
    ).intdigest()
    assert kvhash.hash_block(kvhash.ROOT_PARENT, tokens) == expected


@given(st.lists(st.integers(0, 2**17), max_size=100), st.integers(1, 17))
def test_chain_matches_block_by_block(tokens, block_size):
    hashes = kvhash.hash_blocks(tokens, block_size)
    assert len(hashes) == len(tokens) // block_size
    parent = kvhash.ROOT_PARENT
    for i, h in enumerate(hashes):
        assert h == kvhash.hash_block(parent, tokens[i * block_size : (i + 1) * block_size])
        parent = h


def test_prefix_identifies_whole_prefix():
    a = kvhash.hash_blocks([1, 2, 3, 4, 5, 6, 7, 8], 4)
    b = kvhash.hash_blocks([9, 9, 9, 9, 5, 6, 7, 8], 4)
    assert a[1] != b[1]  # same block tokens, different parents
    assert kvhash.hash_blocks([1, 2, 3, 4, 5], 4) == a[:1]
