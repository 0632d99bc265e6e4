"""The paged KV cache: one tensor ``[layers, 2, kv_heads, num_blocks, block_size, head_dim]``.

Why this order: decode attention gathers each request's blocks with one index on the block
axis, and with kv_heads in front of it the gathered tensor is already
``[2, kv_heads, batch, tokens, head_dim]``, the layout the grouped matmul wants, with no copy.
A token's slot is ``block * block_size + offset``, so writes are one ``index_copy_`` per layer
on a ``[2, kv_heads, num_blocks * block_size, head_dim]`` view.

Export and import on CPU: one call of the block-copy kernel (``csrc/kv_copy.c``) for the whole
list, which copies each block's pieces (one per layer, k/v and head) with streaming stores, or,
where the kernel cannot be built, one strided numpy copy per run of consecutive block ids. On
other devices, one strided ``copy_`` per run. Never a gathered temporary: one pass over the
bytes, as a plain memory copy.

Memory on CPU: the tensor lies on an anonymous mapping advised for transparent huge pages
(``madvise(MADV_HUGEPAGE)``; the kernel's THP mode is "madvise" on most distributions, where
``torch.zeros`` gets 4 KiB pages). A block copy touches 180 pieces of 2 KiB spread over the
whole cache, so with 4 KiB pages nearly every piece is a TLB miss; measured on the AMD EPYC VM
(64 MiB of scattered blocks, paired against memcpy): import 76% -> 104%, export 93% -> 105%
with huge pages (a 128 MiB cache; at 1 GiB the import runs at 140-162% with the kernel's
look-ahead touches). Where THP is off, the advice is a no-op and the pages are ordinary.

One copy between processes (``shared=True``): the cache lies on a memfd (``memfd_create``)
instead, mapped shared; ``shared_region()`` names it (pid, descriptor, layout) and another
process of the same user opens it through ``/proc/<pid>/fd/<fd>`` (``SharedCacheView``) and
copies blocks straight into its own cache (``copy_from_shared``): one copy instead of export
and import. The file's size is checked against the declared layout and every block id
against it in C, so nothing outside the cache is read. A memfd needs no name in /dev/shm: it
goes with the last process that maps it (no leak when the worker dies), and a view mapped
before that stays readable. Shared memory gets huge pages only where ``shmem_enabled`` allows
"advise" (the mapping is advised; it is "never" on the VM measured), so there a prefill
worker's cache is on 4 KiB pages; the writes still go to the destination's huge pages. The
copy's speed falls as the source cache grows (a page walk per scattered piece, over the whole
footprint). The engine copies in steps (``part``: a slice of every block's pieces per step, so
each step reads each run's pieces in ascending order, as one call would), with a page-walk
look-ahead and, on an idle core, a second thread (``copy_threads``; ``csrc/kv_copy.c``). On the
AMD EPYC VM, 64 MiB of scattered blocks from a worker's 1 GiB cache: 37-47% of one memcpy in
the earlier steps of 22 whole blocks, 57-70% in parts on a loaded machine (BENCHMARKS.md).

Export format (what another runner of the same model imports): blocks one after another, each
``[layers, 2, kv_heads, block_size, head_dim]`` in the cache dtype, ``block_nbytes`` bytes.
"""

from __future__ import annotations

import array
import ctypes
import functools
import math
import mmap
import os
import warnings
import weakref
from collections.abc import Callable, Sequence

import numpy as np
import torch

from interlock.engine.model import cpu_ops
from interlock.engine.model.config import ModelArchConfig
from interlock.engine.shared_cache import (
    SharedCacheView,
    layout_mismatch,
    part_range,
    region_of,
    shared_mapping,
)
from interlock.protocol.transfer import SharedCacheRegion

_SAME_SIZE_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
"""Integer dtypes numpy can view a KV dtype's bytes as (bf16 has no numpy dtype)."""


COPY_THREADS_MAX = 2
"""Threads of one copy from a shared cache at most (``copy_threads``)."""
COPY_THREADS_MIN_BYTES = 1 << 20
"""A copy of fewer bytes runs on the calling thread alone (``copy_threads``)."""


def copy_threads(nbytes: int, *, allowed: int, idle: Callable[[], int]) -> int:
    """Threads for a copy of ``nbytes`` from a shared cache (``csrc/kv_copy.c``, copy_by_run's
    note: its speed is bound by the source's page walks, which more threads overlap), given
    the threads the worker computes with (``allowed``) and the cores idle at the moment
    (``idle()``, ``idle_cores``; asked only for a copy that may take a helper). The copy runs on the engine thread between steps, while the
    worker's compute threads wait, so it takes no more than those (1 on a worker given one
    thread), at most ``COPY_THREADS_MAX`` (one memcpy takes all the memory bandwidth there is:
    transfer_bw's ``2 memcpys``), and a helper only on a core that nothing else wants: on a
    busy machine a helper is preempted mid-run and the copy waits for it (AMD EPYC VM, 1 GiB
    caches, BENCHMARKS.md: with a core to spare, two threads 93-121% of memcpy where one gave
    68-90%; with a helper at every step on a busy machine, 47-70% where one gave 71-87%). One
    below ``COPY_THREADS_MIN_BYTES``, where starting a thread (tens of microseconds) would cost
    more than it saves."""
    if nbytes < COPY_THREADS_MIN_BYTES or allowed < 2:
        return 1
    return max(1, min(COPY_THREADS_MAX, allowed, 1 + idle()))


def idle_cores() -> int:
    """Cores of this machine that run nothing at this moment besides the caller (the runnable
    count in ``/proc/loadavg``, the caller included), as far as this process may use them; 0
    where that cannot be read."""
    fd, cores = _loadavg()
    try:
        running = int(os.pread(fd, 128, 0).split()[3].split(b"/")[0])
    except (OSError, ValueError, IndexError):
        return 0
    return max(0, cores - running)


@functools.cache
def _loadavg() -> tuple[int, int]:
    """``/proc/loadavg`` opened once (-1 where it cannot be: ``idle_cores`` then says 0), and
    the cores this process may use."""
    try:
        fd = os.open("/proc/loadavg", os.O_RDONLY)
    except OSError:
        fd = -1
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return fd, min(usable, os.cpu_count() or 1)


def block_nbytes(config: ModelArchConfig, block_size: int, dtype: torch.dtype) -> int:
    elem = torch.empty((), dtype=dtype).element_size()
    return config.num_layers * 2 * config.num_kv_heads * block_size * config.head_dim * elem


def blocks_for_budget(config: ModelArchConfig, block_size: int, dtype: torch.dtype, gib: float) -> int:
    return max(2, int(gib * (1 << 30)) // block_nbytes(config, block_size, dtype))


class PagedKVCache:
    def __init__(
        self,
        config: ModelArchConfig,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
        *,
        shared: bool = False,
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.dtype = dtype
        self.block_nbytes = block_nbytes(config, block_size, dtype)
        shape = (config.num_layers, 2, config.num_kv_heads, num_blocks, block_size, config.head_dim)
        self._mem: mmap.mmap | None = None
        self._memfd = -1
        if shared and device.type != "cpu":
            raise ValueError(f"a shared KV cache must be on the CPU, not {device}")
        if shared:
            self._memfd, self._mem, self.tensor = _shared_zeros(shape, dtype)
            weakref.finalize(self, os.close, self._memfd)  # the mapping keeps the memory
        elif device.type == "cpu":
            self._mem, self.tensor = _huge_page_zeros(shape, dtype)
        else:
            self.tensor = torch.zeros(shape, dtype=dtype, device=device)
        # Per-layer views, built once: blocks for gathering, flat slots for writing.
        self.blocks = [self.tensor[i] for i in range(config.num_layers)]
        flat = (2, config.num_kv_heads, num_blocks * block_size, config.head_dim)
        self.slots = [layer.view(flat) for layer in self.blocks]
        # On CPU, block copies go through numpy on an integer view of the same memory: one
        # single-threaded strided pass (no OpenMP team: copies run beside the model's forward
        # on the tier I/O thread, and on a busy machine torch's threaded copy of a few hundred
        # KB was 5-30x slower than memcpy; numpy's, ~0.5-0.8x).
        self._np: np.ndarray | None = None
        self._kernel: cpu_ops.CopyKernel | None = None
        if self.tensor.device.type == "cpu":
            self._np = self.tensor.view(_SAME_SIZE_INT[self.tensor.element_size()]).numpy()
            self._kernel = cpu_ops.load_copy()
        # The kernel's geometry: block b's piece r lies at (r * num_blocks + b) * piece.
        self._base = self.tensor.data_ptr()
        self._piece = block_size * config.head_dim * self.tensor.element_size()
        self._pieces = config.num_layers * 2 * config.num_kv_heads
        self._dtype_name = str(dtype).removeprefix("torch.")

    def shared_region(self) -> SharedCacheRegion | None:
        """Where another process of this user finds this cache (None unless ``shared``)."""
        if self._memfd < 0:
            return None
        return region_of(
            self._memfd,
            num_blocks=self.num_blocks,
            piece=self._piece,
            pieces=self._pieces,
            dtype=self._dtype_name,
        )

    def layout(self) -> tuple[int, int, str]:
        """``(piece, pieces, dtype)`` of a block (``SharedCacheRegion.layout``)."""
        return (self._piece, self._pieces, self._dtype_name)

    def region_mismatch(self, region: SharedCacheRegion) -> str:
        """Why blocks of ``region`` cannot be copied into this cache ("" when they can)."""
        if self._kernel is None:
            return "no block-copy kernel here (copies from a shared cache need it)"
        return layout_mismatch(region, self._piece, self._pieces, self._dtype_name)

    def copy_from_shared(
        self,
        view: SharedCacheView,
        src_ids: Sequence[int],
        block_ids: Sequence[int],
        part: tuple[int, int] = (0, 1),
    ) -> None:
        """Block ``src_ids[k]`` of another process's cache into our block ``block_ids[k]``: one
        copy; ``part`` = (k, parts): only part k of ``parts`` of every block (a slice of its
        pieces, ``part_range``), so that a transfer copied in steps keeps the one-call order
        (``csrc/kv_copy.c``, ``kv_copy_between``). Raises IndexError naming an id out of range
        (nothing copied then), ValueError for a part that does not exist, a cache of another
        layout or without the kernel."""
        region = view.region
        if reason := self.region_mismatch(region):
            raise ValueError(reason)
        n = len(block_ids)
        if len(src_ids) != n:
            raise ValueError(f"{len(src_ids)} source block ids for {n} block ids")
        r0, r1 = part_range(part, self._pieces)
        assert self._kernel is not None
        if not n or r0 == r1:
            return
        ids, sids = array.array("q", block_ids), array.array("q", src_ids)
        bad = self._kernel.between(
            view.address,
            region.num_blocks,
            sids.buffer_info()[0],
            self._base,
            self.num_blocks,
            self._piece,
            self._pieces,
            ids.buffer_info()[0],
            n,
            r0,
            r1,
            copy_threads(n * (r1 - r0) * self._piece, allowed=torch.get_num_threads(), idle=idle_cores),
        )
        if bad >= n:
            raise IndexError(f"source block id {sids[bad - n]} out of range [0, {region.num_blocks})")
        if bad >= 0:
            raise IndexError(f"block id {ids[bad]} out of range [0, {self.num_blocks})")

    def export_blocks(self, block_ids: Sequence[int], out: memoryview) -> None:
        if self._kernel is not None:
            self._kernel_copy(self._kernel.export, block_ids, out, writable=True)
            return
        runs = self._runs(block_ids)
        # One strided copy per run of consecutive block ids (usually few): [L, 2, H, k, bs, D]
        # -> [k, L, 2, H, bs, D], straight into ``out``, with no gathered temporary.
        if self._np is not None:
            d = self._np_view(out, len(block_ids))
            for i, j, b in runs:
                d[i:j] = self._np[:, :, :, b : b + j - i].transpose(3, 0, 1, 2, 4, 5)
            return
        dest = self._byte_view(out, len(block_ids))
        for i, j, b in runs:
            dest[i:j].copy_(self.tensor[:, :, :, b : b + j - i].permute(3, 0, 1, 2, 4, 5))

    def import_blocks(self, block_ids: Sequence[int], data: memoryview) -> None:
        if self._kernel is not None:
            self._kernel_copy(self._kernel.import_, block_ids, data, writable=False)
            return
        runs = self._runs(block_ids)
        if self._np is not None:
            s = self._np_view(data, len(block_ids))
            for i, j, b in runs:
                self._np[:, :, :, b : b + j - i] = s[i:j].transpose(1, 2, 3, 0, 4, 5)
            return
        src = self._byte_view(data, len(block_ids)).to(self.tensor.device)
        for i, j, b in runs:
            self.tensor[:, :, :, b : b + j - i].copy_(src[i:j].permute(1, 2, 3, 0, 4, 5))

    def import_each(self, block_ids: Sequence[int], blocks: Sequence[memoryview]) -> None:
        """``import_blocks`` of blocks that lie apart (host-tier slots): ``blocks[k]`` (one
        block's bytes) into ``block_ids[k]``, in one kernel call on CPU."""
        n = len(block_ids)
        if len(blocks) != n:
            raise ValueError(f"{len(blocks)} blocks for {n} block ids")
        kernel = self._kernel
        if kernel is None:
            for b, data in zip(block_ids, blocks, strict=True):
                self.import_blocks([b], data)
            return
        pinned = []
        addresses = array.array("q")
        for data in blocks:
            if data.nbytes != self.block_nbytes:
                raise ValueError(f"a block of {data.nbytes} bytes, {self.block_nbytes} expected")
            obj, address = _address(data, writable=False)
            pinned.append(obj)
            addresses.append(address)
        if not n:
            return
        ids = array.array("q", block_ids)
        bad = kernel.import_each(
            self._base,
            self.num_blocks,
            self._piece,
            self._pieces,
            ids.buffer_info()[0],
            n,
            addresses.buffer_info()[0],
        )
        del pinned
        if bad >= 0:
            raise IndexError(f"block id {ids[bad]} out of range [0, {self.num_blocks})")

    def _kernel_copy(
        self, fn: Callable[..., int], block_ids: Sequence[int], buffer: memoryview, *, writable: bool
    ) -> None:
        """One kernel call for all blocks; ids are checked there, before anything is copied.
        Kept lean: the tier I/O thread calls this once per block (a few microseconds of
        Python against ~25 us of copying for a SmolLM2 block)."""
        n = len(block_ids)
        if buffer.nbytes != n * self.block_nbytes:
            raise ValueError(f"buffer holds {buffer.nbytes} bytes, {n} blocks need {n * self.block_nbytes}")
        if not n:
            return
        ids = array.array("q", block_ids)
        pinned, address = _address(buffer, writable=writable)
        bad = fn(self._base, self.num_blocks, self._piece, self._pieces, ids.buffer_info()[0], n, address)
        del pinned
        if bad >= 0:
            raise IndexError(f"block id {ids[bad]} out of range [0, {self.num_blocks})")

    def _runs(self, block_ids: Sequence[int]) -> list[tuple[int, int, int]]:
        """``(i, j, b)``: positions ``i..j-1`` of ``block_ids`` are blocks ``b, b+1, ...``."""
        runs: list[tuple[int, int, int]] = []
        n = self.num_blocks
        for i, b in enumerate(block_ids):
            if not 0 <= b < n:
                raise IndexError(f"block ids out of range [0, {n})")
            if runs and b == runs[-1][2] + (i - runs[-1][0]) and runs[-1][1] == i:
                runs[-1] = (runs[-1][0], i + 1, runs[-1][2])
            else:
                runs.append((i, i + 1, b))
        return runs

    def _np_view(self, buffer: memoryview, num_blocks: int) -> np.ndarray:
        """``buffer`` as ``[n, L, 2, H, bs, D]`` integers of the cache's element size."""
        assert self._np is not None
        expected = num_blocks * self.block_nbytes
        if buffer.nbytes != expected:
            raise ValueError(f"buffer holds {buffer.nbytes} bytes, {num_blocks} blocks need {expected}")
        layers, two, heads, _, bs, dim = self._np.shape
        arr = np.frombuffer(buffer, dtype=self._np.dtype) if expected else np.empty(0, self._np.dtype)
        return arr.reshape(num_blocks, layers, two, heads, bs, dim)

    def _byte_view(self, buffer: memoryview, num_blocks: int) -> torch.Tensor:
        expected = num_blocks * self.block_nbytes
        if buffer.nbytes != expected:
            raise ValueError(f"buffer holds {buffer.nbytes} bytes, {num_blocks} blocks need {expected}")
        _, two, heads, _, bs, dim = self.tensor.shape
        layers = self.tensor.shape[0]
        if not expected:
            flat = torch.empty(0, dtype=torch.uint8)
        else:
            with warnings.catch_warnings():
                # Imports read from a read-only buffer; the tensor is never written then.
                warnings.simplefilter("ignore", UserWarning)
                flat = torch.frombuffer(buffer, dtype=torch.uint8)
        return flat.view(self.dtype).view(num_blocks, layers, two, heads, bs, dim)


def _shared_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> tuple[int, mmap.mmap, torch.Tensor]:
    """A zeroed CPU tensor on a memfd mapped shared (module note): (fd, mapping, tensor)."""
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    fd, mem = shared_mapping(nbytes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        flat = torch.frombuffer(mem, dtype=torch.uint8, count=nbytes)
    tensor = flat.view(dtype).view(shape)
    tensor.zero_()
    return fd, mem, tensor


def _huge_page_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> tuple[mmap.mmap, torch.Tensor]:
    """A zeroed CPU tensor on its own anonymous mapping, advised for huge pages (module note),
    with its pages touched now, as ``torch.zeros`` does. The mapping must outlive the tensor:
    the cache keeps both."""
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    mem = mmap.mmap(-1, max(1, nbytes), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is not None:
        try:
            mem.madvise(advice)
        except OSError:  # a kernel without THP: ordinary pages
            pass
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # frombuffer of a writable mapping
        flat = torch.frombuffer(mem, dtype=torch.uint8, count=nbytes)
    tensor = flat.view(dtype).view(shape)
    tensor.zero_()
    return mem, tensor


def _address(buffer: memoryview, *, writable: bool) -> tuple[object, int]:
    """(an object that keeps ``buffer`` exported while it lives, the address of its bytes)."""
    try:
        pinned = ctypes.c_char.from_buffer(buffer)
        return pinned, ctypes.addressof(pinned)
    except TypeError:  # read-only (ctypes wants a writable buffer) or not contiguous
        if writable and buffer.readonly:
            raise ValueError("export needs a writable buffer") from None
        arr = np.frombuffer(buffer, dtype=np.uint8)
        return arr, int(arr.__array_interface__["data"][0])
