"""Chained block hashes in one compiled loop: the same values as ``kvhash.hash_blocks`` (the
reference and the definition), about 8x faster on long prompts.

The Python loop makes one ``xxh3_64_intdigest`` call per block (a 60k-token prompt: 3,750
calls, ~0.7 ms, on the router's and on the worker's event loop). ``csrc/kvchain.c`` runs the
same loop in C around the xxhash package's own ``XXH3_64bits_withSeed`` (found in its
extension module by ctypes, so there is one XXH3 implementation, not two). It is built once per
machine (``cbuild``) and checked against the reference when loaded; where it cannot be built
or loaded, where a check fails, on big-endian hosts or with ``INTERLOCK_CPU_KERNELS=0``,
``hash_blocks`` is the reference's.
"""

from __future__ import annotations

import ctypes
import logging
import random
import sys
import threading
from collections.abc import Sequence
from functools import cache
from pathlib import Path

import numpy as np

from interlock import cbuild, kvhash

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("csrc") / "kvchain.c"
CFLAGS = ("-O2", "-shared", "-fPIC")
MIN_BLOCKS = 8
"""Fewer blocks than this are hashed by the reference (the ctypes call costs a few µs)."""
_lock = threading.Lock()


def hash_blocks(
    token_ids: Sequence[int],
    block_size: int,
    parent_hash: int = kvhash.ROOT_PARENT,
    *,
    packed: bytes | None = None,
) -> list[int]:
    """``kvhash.hash_blocks``, compiled where it can be (module note). ``packed``: the ids as
    ``kvhash.u32_bytes`` packs them, where the caller has that already."""
    kernel = _kernel()
    if kernel is None or len(token_ids) < MIN_BLOCKS * block_size:
        return kvhash.hash_blocks(token_ids, block_size, parent_hash)
    lib, fn = kernel
    data = packed if packed is not None else kvhash.u32_bytes(token_ids)
    n = len(data) // (4 * block_size)
    out = np.empty(n, dtype=np.uint64)
    lib.kv_hash_chain(fn, data, n, block_size, parent_hash, kvhash.SEED, out.ctypes.data)
    return out.tolist()  # type: ignore[no-any-return]


def trace_hash_chain(
    hash_ids: Sequence[int],
    tokens_per_id: int,
    golden: int,
    pool_size: int,
    block_size: int,
    parent_hash: int,
) -> list[int] | None:
    """The chained hashes of a trace's hash ids expanded to tokens as ``mooncake.blocks_indices``
    does (token j of id h: splitmix64's finalizer of ``h * golden + j`` mod ``pool_size``), in
    one compiled loop; None where the kernel is not available (the caller expands and hashes in
    numpy then; ``sim.trace`` checks the two agree before it uses this)."""
    kernel = _kernel()
    if kernel is None:
        return None
    lib, fn = kernel
    ids = np.asarray(hash_ids, dtype=np.uint64)
    n = len(ids) * (tokens_per_id // block_size)
    out = np.empty(n, dtype=np.uint64)
    got = lib.trace_hash_chain(
        fn,
        ids.ctypes.data,
        len(ids),
        tokens_per_id,
        golden,
        pool_size,
        block_size,
        parent_hash,
        kvhash.SEED,
        out.ctypes.data,
    )
    if got != n:
        raise ValueError(f"trace hashing refused: {tokens_per_id} tokens an id, blocks of {block_size}")
    return out.tolist()  # type: ignore[no-any-return]


@cache
def _kernel() -> tuple[ctypes.CDLL, int] | None:
    if not cbuild.enabled() or sys.byteorder != "little":
        return None
    with _lock:
        try:
            import xxhash._xxhash as native

            fn = ctypes.cast(ctypes.CDLL(native.__file__).XXH3_64bits_withSeed, ctypes.c_void_p).value
            lib = ctypes.CDLL(str(cbuild.build(SOURCE, CFLAGS, "kvchain")))
        except Exception as exc:  # any compiler, loader or symbol failure: the reference
            log.warning("compiled block hashing unavailable, hashing in Python: %s", exc)
            return None
    if fn is None:
        return None
    c = ctypes
    lib.kv_hash_chain.argtypes = [
        c.c_void_p,
        c.c_char_p,
        c.c_int64,
        c.c_int64,
        c.c_uint64,
        c.c_uint64,
        c.c_void_p,
    ]
    lib.kv_hash_chain.restype = c.c_int64
    lib.trace_hash_chain.argtypes = [
        c.c_void_p,
        c.c_void_p,
        c.c_int64,
        c.c_int64,
        c.c_uint64,
        c.c_uint64,
        c.c_int64,
        c.c_uint64,
        c.c_uint64,
        c.c_void_p,
    ]
    lib.trace_hash_chain.restype = c.c_int64
    if not _agrees(lib, fn):
        log.warning("compiled block hashing disagrees with kvhash on a check, hashing in Python")
        return None
    return lib, fn


def _agrees(lib: ctypes.CDLL, fn: int) -> bool:
    rng = random.Random(0x1A7E)
    for block_size in (1, 16, 64, 300):
        ids = [rng.randrange(1 << 32) for _ in range(block_size * 9)]
        parent = rng.randrange(1 << 64)
        out = np.empty(9, dtype=np.uint64)
        lib.kv_hash_chain(fn, kvhash.u32_bytes(ids), 9, block_size, parent, kvhash.SEED, out.ctypes.data)
        if out.tolist() != kvhash.hash_blocks(ids, block_size, parent):
            return False
    return True


def main() -> int:
    """Build and check the kernel now (setup, the image), saying which path hashing takes."""
    print(
        "block hashes: compiled chain" if _kernel() is not None else "block hashes: Python (see the warning)"
    )
    return 0
