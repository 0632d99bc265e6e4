"""One copy between processes: a cache on a memfd, copied from by another process's cache."""

from __future__ import annotations

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
from interlock.engine.model.kv_cache import PagedKVCache, SharedCacheRegion, SharedCacheView
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


@pytest.mark.parametrize("seed", range(12))
def test_the_one_copy_equals_copying_block_by_block_in_call_order(seed: int) -> None:
    """Random id lists: repeated sources, runs consecutive on one side, both or neither, and
    (every third seed) repeated destinations, where the later copy must win as in call order."""
    rng = np.random.default_rng(seed)
    src = PagedKVCache(ARCH, BLOCKS, 4, DTYPE, torch.device("cpu"), shared=True)
    src.tensor.copy_(torch.randn(src.tensor.shape, generator=torch.Generator().manual_seed(seed)))
    region = src.shared_region()
    assert region is not None
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
