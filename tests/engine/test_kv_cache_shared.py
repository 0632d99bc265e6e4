"""One copy between processes: a cache on a memfd, copied from by another process's cache."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import msgspec
import numpy as np
import pytest
import torch

from interlock.engine.model import cpu_ops
from interlock.engine.model.kv_cache import (
    COPY_THREADS_MIN_BYTES,
    PagedKVCache,
    SharedCacheRegion,
    SharedCacheView,
    copy_threads,
    idle_cores,
)
from tests.engine.test_paged_kv_cache import ARCH

pytestmark = pytest.mark.skipif(cpu_ops.load_copy() is None, reason="no block-copy kernel")

BLOCKS = 10
DTYPE = torch.float32

# A source process without torch: a memfd of BLOCKS blocks in the cache layout, filled with a
# known pattern (its byte i = i * 7 % 251), that says its pid and fd and waits for stdin.
_CHILD = textwrap.dedent(
    """
    import os, sys, mmap
    import numpy as np
    n = int(sys.argv[1])
    fd = os.memfd_create("kv-test")
    os.ftruncate(fd, n)
    m = mmap.mmap(fd, n, mmap.MAP_SHARED)
    np.frombuffer(m, np.uint8)[:] = (np.arange(n, dtype=np.int64) * 7 % 251).astype(np.uint8)
    print(os.getpid(), fd, os.fstat(fd).st_ino, flush=True)
    sys.stdin.readline()
    """
)


def _local() -> PagedKVCache:
    return PagedKVCache(ARCH, BLOCKS, 4, DTYPE, torch.device("cpu"))


@pytest.fixture
def source() -> Iterator[tuple[subprocess.Popen[str], SharedCacheRegion]]:
    kv = _local()
    assert kv.shared_region() is None
    nbytes = BLOCKS * kv.block_nbytes
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(nbytes)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        pid, fd, ino = map(int, proc.stdout.readline().split())
        yield (
            proc,
            SharedCacheRegion(
                pid=pid,
                fd=fd,
                ino=ino,
                num_blocks=BLOCKS,
                piece=kv._piece,
                pieces=kv._pieces,
                dtype="float32",
            ),
        )
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _pattern_cache(kv: PagedKVCache) -> torch.Tensor:
    n = BLOCKS * kv.block_nbytes
    raw = (np.arange(n, dtype=np.int64) * 7 % 251).astype(np.uint8)
    return torch.from_numpy(raw).view(DTYPE).view(kv.tensor.shape)


def test_blocks_are_copied_from_another_process_cache(
    source: tuple[subprocess.Popen[str], SharedCacheRegion],
) -> None:
    _, region = source
    kv = _local()
    view = SharedCacheView(region)
    try:
        src_ids, dst_ids = [7, 2, 3, 4, 0], [1, 9, 8, 5, 6]
        kv.copy_from_shared(view, src_ids, dst_ids)
    finally:
        view.close()
    want = _pattern_cache(kv)
    for s, d in zip(src_ids, dst_ids, strict=True):
        assert torch.equal(kv.tensor[:, :, :, d], want[:, :, :, s])
    assert not kv.tensor[:, :, :, [2, 3, 4, 7]].any()


def test_a_source_that_dies_after_the_view_is_mapped_leaves_it_readable(
    source: tuple[subprocess.Popen[str], SharedCacheRegion],
) -> None:
    proc, region = source
    kv = _local()
    view = SharedCacheView(region)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    kv.copy_from_shared(view, [3], [0])
    view.close()
    assert torch.equal(kv.tensor[:, :, :, 0], _pattern_cache(kv)[:, :, :, 3])
    with pytest.raises(OSError):  # gone: nothing to open any more
        SharedCacheView(region)


def test_ids_out_of_range_and_a_layout_that_lies_are_refused_by_name(
    source: tuple[subprocess.Popen[str], SharedCacheRegion],
) -> None:
    _, region = source
    kv = _local()
    view = SharedCacheView(region)
    try:
        with pytest.raises(IndexError, match=f"source block id {BLOCKS} out of range"):
            kv.copy_from_shared(view, [1, BLOCKS], [0, 1])
        with pytest.raises(IndexError, match="block id -1 out of range"):
            kv.copy_from_shared(view, [1, 2], [0, -1])
        with pytest.raises(ValueError, match="2 source block ids for 1"):
            kv.copy_from_shared(view, [1, 2], [0])
        other = msgspec.structs.replace(region, piece=region.piece * 2, num_blocks=BLOCKS // 2)
        with pytest.raises(ValueError, match="shared cache layout"):
            kv.copy_from_shared(SharedCacheView(other), [0], [0])
    finally:
        view.close()
    assert not kv.tensor.any()  # nothing copied by a refused call
    with pytest.raises(ValueError, match="its layout declares"):  # more than the file holds
        SharedCacheView(msgspec.structs.replace(region, num_blocks=BLOCKS + 1))
    with pytest.raises(ValueError, match="is another file"):  # a reused pid or fd
        SharedCacheView(msgspec.structs.replace(region, ino=region.ino + 1))
    assert "dtype" in kv.region_mismatch(msgspec.structs.replace(region, dtype="bfloat16"))
    assert kv.region_mismatch(region) == ""


def test_a_shared_cache_is_found_by_its_region_in_this_process() -> None:
    src = PagedKVCache(ARCH, BLOCKS, 4, DTYPE, torch.device("cpu"), shared=True)
    src.tensor.copy_(torch.randn(src.tensor.shape))
    region = src.shared_region()
    assert region is not None and region.pid == os.getpid() and region.nbytes == src.tensor.nbytes
    kv = _local()
    view = SharedCacheView(region)
    kv.copy_from_shared(view, [4, 5, 6], [4, 5, 6])  # consecutive runs too
    view.close()
    assert torch.equal(kv.tensor[:, :, :, 4:7], src.tensor[:, :, :, 4:7])


def _random_shared(seed: int) -> tuple[PagedKVCache, SharedCacheRegion]:
    """A shared cache of random values, and its region."""
    src = PagedKVCache(ARCH, BLOCKS, 4, DTYPE, torch.device("cpu"), shared=True)
    src.tensor.copy_(torch.randn(src.tensor.shape, generator=torch.Generator().manual_seed(seed)))
    region = src.shared_region()
    assert region is not None
    return src, region


@pytest.mark.parametrize("seed", range(12))
def test_the_one_copy_equals_copying_block_by_block_in_call_order(seed: int) -> None:
    """Random id lists: repeated sources, runs consecutive on one side, both or neither, and
    (every third seed) repeated destinations, where the later copy must win as in call order."""
    rng = np.random.default_rng(seed)
    src, region = _random_shared(seed)
    kv = _local()
    n = int(rng.integers(1, BLOCKS + 1))
    start = int(rng.integers(0, BLOCKS - n + 1))
    dst_ids = [
        int(b) for b in (rng.permutation(BLOCKS)[:n] if rng.random() < 0.5 else range(start, start + n))
    ]
    if seed % 3 == 0 and n > 1:
        dst_ids[-1] = dst_ids[0]
    src_ids = [
        int(b) for b in (rng.integers(0, BLOCKS, n) if rng.random() < 0.5 else range(start, start + n))
    ]
    want = kv.tensor.clone()
    for s, d in zip(src_ids, dst_ids, strict=True):
        want[:, :, :, d] = src.tensor[:, :, :, s]
    view = SharedCacheView(region)
    try:
        kv.copy_from_shared(view, src_ids, dst_ids)
    finally:
        view.close()
    assert torch.equal(kv.tensor, want)


@pytest.mark.parametrize("seed", range(12))
def test_the_one_copy_in_parts_equals_copying_block_by_block(seed: int) -> None:
    """A copy in ``parts`` calls of one part each (a slice of every block's pieces; sometimes
    more parts than pieces, some of them empty) ends as the copy block by block; in between,
    exactly the parts copied so far have arrived."""
    rng = np.random.default_rng(100 + seed)
    src, region = _random_shared(seed)
    kv = _local()
    n = int(rng.integers(1, BLOCKS + 1))
    dst_ids = [int(b) for b in rng.permutation(BLOCKS)[:n]]
    if seed % 3 == 0 and n > 1:
        dst_ids[-1] = dst_ids[0]  # the later copy wins, as in call order
    src_ids = [int(b) for b in rng.integers(0, BLOCKS, n)]
    want = kv.tensor.clone()
    for s, d in zip(src_ids, dst_ids, strict=True):
        want[:, :, :, d] = src.tensor[:, :, :, s]
    parts = int(rng.integers(1, kv._pieces + 3))
    view = SharedCacheView(region)
    try:
        for k in range(parts):
            kv.copy_from_shared(view, src_ids, dst_ids, (k, parts))
            upto = (k + 1) * kv._pieces // parts  # pieces (layer, k/v, head) arrived so far
            got = kv.tensor.flatten(0, 2)
            assert torch.equal(got[:upto], want.flatten(0, 2)[:upto])
            assert not got[upto:].any()
    finally:
        view.close()
    assert torch.equal(kv.tensor, want)


def test_a_part_that_does_not_exist_is_refused_and_nothing_copied() -> None:
    src = PagedKVCache(ARCH, BLOCKS, 4, DTYPE, torch.device("cpu"), shared=True)
    src.tensor.fill_(1.0)
    region = src.shared_region()
    assert region is not None
    kv = _local()
    view = SharedCacheView(region)
    try:
        for part in ((4, 4), (-1, 4), (0, 0)):
            with pytest.raises(ValueError, match=f"part {part[0]} of {part[1]} does not exist"):
                kv.copy_from_shared(view, [1, 2], [3, 4], part)
        with pytest.raises(IndexError, match=f"source block id {BLOCKS} out of range"):
            kv.copy_from_shared(view, [1, BLOCKS], [3, 4], (1, 3))
    finally:
        view.close()
    assert not kv.tensor.any()


def _kernel_between(
    src: PagedKVCache, kv: PagedKVCache, src_ids: list[int], ids: list[int], r0: int, r1: int, threads: int
) -> int:
    kernel = cpu_ops.load_copy()
    assert kernel is not None
    s, d = np.asarray(src_ids, np.int64), np.asarray(ids, np.int64)
    return kernel.between(
        src.tensor.data_ptr(), src.num_blocks, s.ctypes.data, kv.tensor.data_ptr(), kv.num_blocks,
        kv._piece, kv._pieces, d.ctypes.data, len(ids), r0, r1, threads,
    )  # fmt: skip


@pytest.mark.parametrize("seed", range(16))
def test_the_kernel_on_threads_copies_a_run_range_as_the_reference(seed: int) -> None:
    """``kv_copy_between`` with 1-9 threads claiming runs, or 1,000 (more than the runs, or than it
    starts, some seeds): runs r0..r1-1 of each block arrive as a copy block by block in call
    order would leave them, nothing else is written; a bad run range or id copies nothing."""
    rng = np.random.default_rng(200 + seed)
    blocks = 24
    src = PagedKVCache(ARCH, blocks, 4, DTYPE, torch.device("cpu"))
    src.tensor.copy_(torch.randn(src.tensor.shape, generator=torch.Generator().manual_seed(seed)))
    kv = PagedKVCache(ARCH, blocks + 5, 4, DTYPE, torch.device("cpu"))
    n = int(rng.integers(1, blocks + 1))
    ids = [int(b) for b in rng.permutation(blocks + 5)[:n]]
    if seed % 4 == 0 and n > 1:
        ids[-1] = ids[0]
    src_ids = [int(b) for b in rng.integers(0, blocks, n)]
    runs = kv._pieces
    r0 = int(rng.integers(0, runs + 1))
    r1 = int(rng.integers(r0, runs + 1))
    threads = int(rng.integers(1, 10)) if seed % 5 else 1000  # capped at MAX_THREADS in C
    want = kv.tensor.clone().flatten(0, 2)
    source = src.tensor.flatten(0, 2)
    for s, d in zip(src_ids, ids, strict=True):
        want[r0:r1, d] = source[r0:r1, s]
    assert _kernel_between(src, kv, src_ids, ids, r0, r1, threads) == -1
    assert torch.equal(kv.tensor.flatten(0, 2), want)
    before = kv.tensor.clone()
    assert _kernel_between(src, kv, src_ids, ids, r1, r0 - 1, threads) == 2 * n  # a bad range
    assert _kernel_between(src, kv, src_ids, ids, 0, runs + 1, threads) == 2 * n
    assert _kernel_between(src, kv, [*src_ids[:-1], blocks], ids, r0, r1, threads) == 2 * n - 1
    assert torch.equal(kv.tensor, before)


def test_copy_threads_takes_what_the_worker_computes_with_and_idle_cores_only() -> None:
    big = COPY_THREADS_MIN_BYTES

    def never() -> int:
        raise AssertionError("idle cores read for a copy that takes no helper anyway")

    assert copy_threads(big, allowed=8, idle=lambda: 8) == 2  # at most two
    assert copy_threads(big, allowed=1, idle=never) == 1  # a worker given one thread
    assert copy_threads(big, allowed=8, idle=lambda: 0) == 1  # a busy machine: no helper
    assert copy_threads(big, allowed=0, idle=never) == 1
    assert copy_threads(big - 1, allowed=8, idle=never) == 1  # too small to be worth a thread
    assert 0 <= idle_cores() < (os.cpu_count() or 1)  # the caller runs on one of them


def test_a_large_copy_equals_the_reference() -> None:
    """Through ``copy_from_shared``, a copy big enough for a helper thread (where the rule
    gives one at that moment), in parts: the same bytes as block by block."""
    arch = dataclasses.replace(ARCH, num_layers=4, num_kv_heads=4, num_heads=4, head_dim=64)
    src = PagedKVCache(arch, 64, 16, DTYPE, torch.device("cpu"), shared=True)
    src.tensor.copy_(torch.randn(src.tensor.shape, generator=torch.Generator().manual_seed(5)))
    kv = PagedKVCache(arch, 80, 16, DTYPE, torch.device("cpu"))
    rng = np.random.default_rng(5)
    src_ids = [int(b) for b in rng.permutation(64)[:48]]
    ids = [int(b) for b in rng.permutation(80)[:48]]
    region = src.shared_region()
    assert region is not None
    view = SharedCacheView(region)
    try:
        for k in range(2):
            kv.copy_from_shared(view, src_ids, ids, (k, 2))
    finally:
        view.close()
    want = torch.zeros_like(kv.tensor)
    for s, d in zip(src_ids, ids, strict=True):
        want[:, :, :, d] = src.tensor[:, :, :, s]
    assert torch.equal(kv.tensor, want)
