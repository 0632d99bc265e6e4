"""Buffer reuse: staging segments (source), mapped segments (destination), receive buffers (TCP).

Why: on this VM, first-touching a fresh 64 MiB mapping costs ~120 ms and unmapping it ~45 ms,
against ~10 ms to copy the same bytes once (BENCHMARKS.md), so transfers reuse memory. Each
pool is bounded in bytes; sizes are rounded up to a class (at most 25% slack) so payloads of
similar size share buffers. Pools hold only idle buffers: one in use belongs to its transfer.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict

from interlock.transfer import staging as stg

MIN_CLASS = 64 << 10


def size_class(nbytes: int) -> int:
    """Round up to 4 steps per power of two (>= MIN_CLASS)."""
    if nbytes <= MIN_CLASS:
        return MIN_CLASS
    step = 1 << max(0, nbytes.bit_length() - 3)
    return -(-nbytes // step) * step


class _Pool:
    """Idle objects by capacity, best fit, bounded in total bytes."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._idle: list[tuple[int, object]] = []
        self._idle_bytes = 0
        self._lock = threading.Lock()

    def _take(self, nbytes: int) -> object | None:
        with self._lock:
            fits = [
                (cap, i) for i, (cap, _) in enumerate(self._idle) if nbytes <= cap <= 2 * size_class(nbytes)
            ]
            if not fits:
                return None
            cap, i = min(fits)
            self._idle_bytes -= cap
            return self._idle.pop(i)[1]

    def _give(self, capacity: int, obj: object) -> bool:
        with self._lock:
            if not self.max_bytes or self._idle_bytes + capacity > self.max_bytes:
                return False
            self._idle.append((capacity, obj))
            self._idle_bytes += capacity
            return True

    def _drain(self) -> list[object]:
        with self._lock:
            objs = [obj for _, obj in self._idle]
            self._idle, self._idle_bytes = [], 0
            return objs


class SegmentPool(_Pool):
    """Source staging buffers (in /dev/shm when ``shared``)."""

    def __init__(self, max_bytes: int, *, shared: bool) -> None:
        super().__init__(max_bytes)
        self.shared = shared

    def take(self, nbytes: int) -> stg.Staging:
        st = self._take(nbytes)
        if isinstance(st, stg.Staging):
            return st
        capacity = size_class(nbytes) if self.max_bytes else nbytes
        return stg.Staging.create(capacity, shared=self.shared)

    def give(self, st: stg.Staging) -> None:
        if not self._give(st.capacity, st):
            st.release()

    def close(self) -> None:
        for st in self._drain():
            assert isinstance(st, stg.Staging)
            st.release()


class RecvPool(_Pool):
    """TCP receive buffers: already faulted in, so receiving writes to warm pages."""

    def take(self, nbytes: int) -> bytearray:
        buf = self._take(nbytes)
        if isinstance(buf, bytearray):
            return buf
        return bytearray(size_class(nbytes) if self.max_bytes else nbytes)

    def give(self, buf: bytearray) -> None:
        self._give(len(buf), buf)

    def close(self) -> None:
        self._drain()


class AttachCache:
    """Destination mappings of other processes' segments, kept while their file lives, so a
    recycled source segment is not mapped again per transfer. LRU, bounded in bytes."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._maps: OrderedDict[str, tuple[int, stg.Staging]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, name: str) -> stg.Staging:
        """A mapping of ``name`` (raises like ``Staging.attach``). With caching off, the caller
        owns it and must ``release(unlink=False)``; otherwise the cache does."""
        inode = os.stat(stg.SHM_DIR / name).st_ino if "/" not in name else -1
        with self._lock:
            hit = self._maps.get(name)
            if hit is not None and hit[0] == inode:
                self._maps.move_to_end(name)
                return hit[1]
        st = stg.Staging.attach(name)
        if self.max_bytes:
            with self._lock:
                old = self._maps.pop(name, None)
                self._maps[name] = (inode, st)
            if old is not None:
                old[1].release(unlink=False)
            self._evict()
        return st

    @property
    def caching(self) -> bool:
        return self.max_bytes > 0

    def drop(self, name: str) -> None:
        with self._lock:
            hit = self._maps.pop(name, None)
        if hit is not None:
            hit[1].release(unlink=False)

    def prune(self) -> None:
        """Forget mappings whose file is gone (the source unlinked it or died)."""
        with self._lock:
            names = list(self._maps)
        for name in names:
            if not (stg.SHM_DIR / name).exists():
                self.drop(name)

    def _evict(self) -> None:
        while True:
            with self._lock:
                total = sum(st.capacity for _, st in self._maps.values())
                if total <= self.max_bytes or len(self._maps) <= 1:
                    return
                _, (_, st) = self._maps.popitem(last=False)
            st.release(unlink=False)

    def close(self) -> None:
        with self._lock:
            maps, self._maps = list(self._maps.values()), OrderedDict()
        for _, st in maps:
            st.release(unlink=False)
