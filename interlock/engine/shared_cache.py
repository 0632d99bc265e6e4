"""One copy between two workers of a host: a KV cache on a memfd, mapped read-only by a peer.

A prefill worker whose cache is shared (``CacheConfig.shared_kv_cache``) keeps it on a memfd
(``memfd_create``) mapped shared, and names it in its transfer descriptors
(``SharedCacheRegion``: pid, fd, inode, layout). A decode worker on the same host opens
``/proc/<pid>/fd/<fd>`` (same user; ptrace-read access), maps it read-only
(``SharedCacheView``) and copies the request's blocks straight into its own cache: one pass
over the bytes, where export and import are two.

Why a memfd: it needs no name in /dev/shm and goes with the last process that maps it, so a
dead worker leaks nothing; a view mapped before the death stays readable (its pages live as
long as the mapping). What a reader may trust is the transfer's business
(``transfer.dest.DirectDest``): the source holds the blocks until the destination says DONE.

Views are cached per source (``SharedViews``: one mapping per (pid, fd), checked against the
inode on every use) and forgotten when the source goes away; a view is never unmapped while a
copy can still use it (the pull holds a reference, and the mapping goes with the last one).
"""

from __future__ import annotations

import mmap
import os
import threading

import numpy as np

from interlock.engine.kv_cache_manager import cdiv
from interlock.protocol.transfer import SharedCacheRegion
from interlock.transfer.staging import pid_alive


def shared_mapping(nbytes: int, name: str = "interlock-kv-cache") -> tuple[int, mmap.mmap]:
    """A zero-filled memfd of ``nbytes`` and its shared writable mapping: (fd, mapping). The
    mapping is advised for huge pages (honoured where ``shmem_enabled`` allows "advise")."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, nbytes)
        mem = mmap.mmap(fd, max(1, nbytes), mmap.MAP_SHARED)
    except BaseException:
        os.close(fd)
        raise
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is not None:
        try:
            mem.madvise(advice)
        except OSError:  # no THP in this kernel: ordinary pages
            pass
    return fd, mem


def region_of(fd: int, *, num_blocks: int, piece: int, pieces: int, dtype: str) -> SharedCacheRegion:
    """This process's memfd ``fd`` as a peer finds it."""
    return SharedCacheRegion(
        pid=os.getpid(),
        fd=fd,
        ino=os.fstat(fd).st_ino,
        num_blocks=num_blocks,
        piece=piece,
        pieces=pieces,
        dtype=dtype,
    )


def part_range(part: tuple[int, int], length: int) -> tuple[int, int]:
    """Part ``k`` of ``parts`` (``part`` = (k, parts)) of ``length`` pieces as a range
    [start, stop): the parts are as equal as whole pieces allow, together exactly the whole, and
    empty where there are more parts than pieces. Raises ValueError for a part that does not
    exist. The one copy in steps copies part k of every block per step (``copy_from_shared``)."""
    k, parts = part
    if not 0 <= k < parts:
        raise ValueError(f"part {k} of {parts} does not exist")
    return k * length // parts, (k + 1) * length // parts


def copy_parts(nbytes: int, step_bytes: int) -> int:
    """How many parts a one copy of ``nbytes`` takes in steps of about ``step_bytes``."""
    return max(1, cdiv(nbytes, max(1, step_bytes)))


def layout_mismatch(region: SharedCacheRegion, piece: int, pieces: int, dtype: str) -> str:
    """Why blocks of ``region`` cannot be copied into a cache of this layout ("": they can)."""
    mine = (piece, pieces, dtype)
    if region.layout() != mine:
        return f"shared cache layout {region.layout()}, this cache {mine} (piece, pieces, dtype)"
    return ""


class SharedCacheView:
    """Another process's shared cache mapped read-only here. Raises OSError when it cannot be
    opened (the process gone, no permission, /proc not mounted), ValueError when the file is
    not the one declared (another inode, another size)."""

    def __init__(self, region: SharedCacheRegion) -> None:
        if min(region.num_blocks, region.piece, region.pieces) <= 0:
            raise ValueError(f"shared cache region with an empty layout: {region}")
        fd = os.open(f"/proc/{region.pid}/fd/{region.fd}", os.O_RDONLY)
        try:
            st = os.fstat(fd)
            if st.st_ino != region.ino:
                raise ValueError(f"/proc/{region.pid}/fd/{region.fd} is another file (inode {st.st_ino})")
            if st.st_size != region.nbytes:
                raise ValueError(f"shared cache of {st.st_size} bytes, its layout declares {region.nbytes}")
            self._mem: mmap.mmap | None = mmap.mmap(fd, st.st_size, mmap.MAP_SHARED, mmap.PROT_READ)
        finally:
            os.close(fd)
        self.region = region
        self.array = np.frombuffer(self._mem, dtype=np.uint8)
        """The whole cache, read-only bytes."""
        self.address = int(self.array.__array_interface__["data"][0])

    def close(self) -> None:
        """Unmap now (tests, benchmarks). A copy must not run then; ``SharedViews`` never
        calls this: its views unmap when the last reference goes."""
        mem, self._mem = self._mem, None
        if mem is not None:
            del self.array
            mem.close()


class SharedViews:
    """Mapped peer caches, one per source (pid, fd). ``get`` maps on first use and checks the
    inode every time (a restarted source has a new pid or file); ``prune`` forgets views of
    processes that died. Thread-safe; views are dropped, never closed (see the module note)."""

    def __init__(self) -> None:
        self._views: dict[tuple[int, int], SharedCacheView] = {}
        self._lock = threading.Lock()

    def get(self, region: SharedCacheRegion) -> SharedCacheView:
        """A view of ``region`` (raises as ``SharedCacheView``)."""
        key = (region.pid, region.fd)
        with self._lock:
            view = self._views.get(key)
        if view is not None and view.region == region:
            return view
        view = SharedCacheView(region)
        with self._lock:
            self._views[key] = view
        return view

    def prune(self) -> int:
        """Forget views of dead processes; returns how many."""
        with self._lock:
            dead = [k for k in self._views if not pid_alive(k[0])]
            for k in dead:
                del self._views[k]
        return len(dead)

    def __len__(self) -> int:
        return len(self._views)

    def clear(self) -> None:
        with self._lock:
            self._views.clear()
