"""How the ranks of a group talk: an all-reduce per stage, hidden states between stages.

Two all-reduces per layer is the price of tensor parallelism, so the CPU one is the one that
matters: through ``torch.distributed``'s gloo on loopback it took 0.5-0.7 ms for one decode
row of SmolLM2 (576 floats) on the 2-core Intel Xeon of 2026-12-06, 60 of them a step. Over
shared memory (``ShmReduce``) it is a copy, a flag and a sum: each rank writes its partial sums
into its own slot of a mapping shared by the stage, publishes a sequence number, waits for
every other rank's, and adds the slots up in rank order in fp32, so every rank gets the same
bits. Two sets of slots alternate by sequence parity: a rank can only be writing call ``n + 2``
after every rank has published ``n + 1``, that is after all of them finished reading ``n``'s
slots. A tensor larger than a slot goes through in pieces. The flags are C atomics
(``csrc/shm_sync.c``: release and acquire, right on Arm too); where that cannot be built, or on
CUDA, gloo (or NCCL) does the all-reduce.

Between pipeline stages the hidden states of a micro-batch go by gloo's send and receive (once
per micro-batch and stage, not per layer).

Every wait has a deadline (``timeout_s``): a rank that died or hangs raises ``GroupLost`` in the
others rather than blocking them for good.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import threading
from datetime import timedelta
from functools import cache
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from interlock import cbuild
from interlock.engine.model.partition import RankShard
from interlock.errors import EngineError

log = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "shm_sync.c"
CFLAGS = ("-O2", "-shared", "-fPIC")
FLAG_STRIDE = 8
"""int64s between two ranks' flags: one 64-byte cache line each."""
SPINS = 4000
"""Pause-loop iterations before a waiting rank starts yielding its core."""
SLOT_ELEMENTS = 1 << 20
"""fp32 elements of one rank's slot at most (4 MiB); larger tensors go through in pieces."""

_lock = threading.Lock()


class GroupLost(EngineError):
    """A rank of the group died or stopped answering: the group cannot compute any more."""


@cache
def load_sync() -> ctypes.CDLL | None:
    """The flags' C helper, or None where it cannot be built (then gloo all-reduces)."""
    if not cbuild.enabled():
        return None
    with _lock:
        try:
            lib = ctypes.CDLL(str(cbuild.build(SOURCE, CFLAGS, "shm_sync")))
        except Exception as exc:  # any compiler or loader failure: gloo instead, said once
            log.warning("shared-memory all-reduce unavailable, using gloo: %s", exc)
            return None
    lib.shm_publish.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.shm_publish.restype = None
    lib.shm_wait.argtypes = [ctypes.c_void_p] + [ctypes.c_int64] * 5
    lib.shm_wait.restype = ctypes.c_int64
    return lib


def shm_bytes(ranks: int, elements: int) -> int:
    return ranks * FLAG_STRIDE * 8 + 2 * ranks * elements * 4


def create_shm(ranks: int, elements: int) -> int:
    """A memfd sized for a stage of ``ranks`` with slots of ``elements`` (inheritable: the
    ranks' processes get it through ``pass_fds``)."""
    fd = os.memfd_create("interlock-allreduce", 0)
    os.ftruncate(fd, shm_bytes(ranks, elements))
    os.set_inheritable(fd, True)
    return fd


class ShmReduce:
    """The all-reduce of one stage over shared memory (see the module note)."""

    def __init__(self, fd: int, ranks: int, index: int, elements: int, timeout_s: float) -> None:
        lib = load_sync()
        if lib is None:
            raise RuntimeError("the shared-memory all-reduce needs its C helper")
        self._lib = lib
        self._map = mmap.mmap(fd, shm_bytes(ranks, elements))
        whole = torch.frombuffer(self._map, dtype=torch.uint8)
        header = ranks * FLAG_STRIDE * 8
        self._flags = whole[:header].view(torch.int64)
        self._slots = whole[header:].view(torch.float32).view(2, ranks, elements)
        self._flag_ptr = self._flags.data_ptr()
        self._ranks, self._index, self._elements = ranks, index, elements
        self._timeout_ns = int(timeout_s * 1e9)
        self._seq = int(self._flags[index * FLAG_STRIDE])

    def __call__(self, partial: torch.Tensor) -> torch.Tensor:
        flat = partial.reshape(-1)
        out = torch.empty(flat.numel(), dtype=torch.float32)
        for start in range(0, flat.numel(), self._elements):
            n = min(self._elements, flat.numel() - start)
            self._seq += 1
            slots = self._slots[self._seq % 2, :, :n]
            slots[self._index].copy_(flat[start : start + n])
            self._lib.shm_publish(self._flag_ptr + self._index * FLAG_STRIDE * 8, self._seq)
            late = self._lib.shm_wait(
                self._flag_ptr, self._ranks, FLAG_STRIDE, self._seq, SPINS, self._timeout_ns
            )
            if late >= 0:
                raise GroupLost(f"tensor rank {late} of this stage did not answer an all-reduce")
            acc = out[start : start + n]
            acc.copy_(slots[0])
            for r in range(1, self._ranks):
                acc.add_(slots[r])
        return out.view(partial.shape).to(partial.dtype)

    def close(self) -> None:
        self._map.close()


class GlooReduce:
    """The all-reduce of one stage through a process group (gloo; NCCL on CUDA)."""

    def __init__(self, group: Any) -> None:
        self._group = group

    def __call__(self, partial: torch.Tensor) -> torch.Tensor:
        total = partial.float() if partial.device.type == "cpu" else partial.clone()
        try:
            self._group.allreduce([total]).wait()
        except RuntimeError as exc:
            raise GroupLost(f"an all-reduce failed: {exc}") from exc
        return total.to(partial.dtype)

    def close(self) -> None:
        pass


def process_group(
    store_path: str, name: str, rank: int, size: int, timeout_s: float, device: torch.device
) -> Any:
    """A process group of ``size`` ranks met through the file ``store_path`` (no port to
    pick), named so that several groups share one file; none is made the default group. Its
    constructor returns once all ``size`` ranks have joined (or raises after ``timeout_s``)."""
    store = dist.PrefixStore(name, dist.FileStore(store_path, -1))
    timeout = timedelta(seconds=timeout_s)
    if device.type == "cuda":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, size, options)
    options = getattr(dist.ProcessGroupGloo, "_Options")()  # noqa: B009 - private, not in the stubs
    options._timeout = timeout
    # One host: loopback, whatever the host name resolves to.
    options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    return dist.ProcessGroupGloo(store, rank, size, options)


class StageLink:
    """Hidden states between pipeline stages: send to the next stage's counterpart, receive
    from the previous one's (and the last stage's rows back to the driver)."""

    def __init__(self, group: Any) -> None:
        self._group = group
        self._pending: list[tuple[dist.Work, torch.Tensor]] = []

    def send(self, tensor: torch.Tensor, to: int, tag: int) -> None:
        """Start sending ``tensor`` (kept alive until ``flush``)."""
        tensor = tensor.contiguous()
        self._pending.append((self._group.send([tensor], to, tag), tensor))

    def recv(
        self, shape: tuple[int, int], dtype: torch.dtype, src: int, tag: int, device: torch.device
    ) -> torch.Tensor:
        out = torch.empty(shape, dtype=dtype, device=device)
        try:
            self._group.recv([out], src, tag).wait()
        except RuntimeError as exc:
            raise GroupLost(f"rank {src} sent no hidden states: {exc}") from exc
        return out

    def flush(self) -> None:
        """Wait until every send started has gone."""
        pending, self._pending = self._pending, []
        try:
            for work, _ in pending:
                work.wait()
        except RuntimeError as exc:
            raise GroupLost(f"a send to the next stage failed: {exc}") from exc


def connect(
    shard: RankShard, *, store: str, reduce_fd: int, elements: int, timeout_s: float, device: torch.device
) -> tuple[ShmReduce | GlooReduce | None, StageLink | None]:
    """This rank's all-reduce (None: alone in its stage) and link to the other stages (None:
    one stage). Every rank of the group calls it at start: the process groups meet here."""
    link = None
    if shard.pipeline_size > 1:
        link = StageLink(process_group(store, "stages", shard.rank, shard.world, timeout_s, device))
    reduce: ShmReduce | GlooReduce | None = None
    if shard.tensor_size > 1:
        if reduce_fd >= 0:
            reduce = ShmReduce(reduce_fd, shard.tensor_size, shard.tensor_rank, elements, timeout_s)
        else:
            group = process_group(
                store, f"stage{shard.stage}", shard.tensor_rank, shard.tensor_size, timeout_s, device
            )
            reduce = GlooReduce(group)
    return reduce, link
