"""Block hashes for prefix caching, shared by the engine and the router.

A block's hash identifies the whole prefix up to and including that block: it is XXH3-64 over
the parent block's hash (8 bytes, little endian) followed by the block's token ids (each as a
4-byte little-endian unsigned int), with seed ``SEED``. The first block's parent hash is
``ROOT_PARENT`` (0). Only full blocks are hashed; a partial last block has no hash.

This is the only definition in the project: the engine stamps blocks with it and the router
indexes with it, so the two always agree.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import xxhash

SEED = 0x1A7E_10C4
"""Documented seed of the block hash (``0x1A7E10C4``, "interlock")."""

ROOT_PARENT = 0
"""Parent hash of the first block of every sequence."""


def hash_block(parent_hash: int, token_ids: Sequence[int]) -> int:
    """Hash of one full block given its parent's hash."""
    h = xxhash.xxh3_64(seed=SEED)
    h.update(parent_hash.to_bytes(8, "little"))
    h.update(np.asarray(token_ids, dtype=np.uint32).tobytes())
    return h.intdigest()


def hash_blocks(token_ids: Sequence[int], block_size: int, parent_hash: int = ROOT_PARENT) -> list[int]:
    """Chained hashes of every full block of ``token_ids``."""
    arr = np.asarray(token_ids, dtype=np.uint32)
    n_full = len(arr) // block_size
    out: list[int] = []
    parent = parent_hash
    for i in range(n_full):
        h = xxhash.xxh3_64(seed=SEED)
        h.update(parent.to_bytes(8, "little"))
        h.update(arr[i * block_size : (i + 1) * block_size].tobytes())
        parent = h.intdigest()
        out.append(parent)
    return out
