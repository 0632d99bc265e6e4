"""The compiled block-hash chain gives the reference's values (``kvhash.hash_blocks``)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from interlock import kvchain, kvhash


def test_it_builds_and_loads_here() -> None:
    assert kvchain._kernel() is not None  # a C compiler is part of the setup


@pytest.mark.parametrize("block_size", [1, 4, 16, 64, 257, 300])
def test_compiled_chain_equals_the_reference(block_size: int) -> None:
    rng = random.Random(block_size)
    for n in (0, block_size - 1, kvchain.MIN_BLOCKS * block_size, 40 * block_size + 5):
        ids = [rng.randrange(1 << 32) for _ in range(max(0, n))]
        parent = rng.choice([kvhash.ROOT_PARENT, rng.randrange(1 << 64)])
        expected = kvhash.hash_blocks(ids, block_size, parent)
        assert kvchain.hash_blocks(ids, block_size, parent) == expected
        assert kvchain.hash_blocks(tuple(ids), block_size, parent) == expected
        assert kvchain.hash_blocks(np.array(ids, dtype=np.int64), block_size, parent) == expected


def test_bad_ids_fail_as_in_the_reference() -> None:
    with pytest.raises(OverflowError):
        kvchain.hash_blocks([-1] * 256, 16)
