"""A host-memory tier shared by the workers of one host: one file in ``/dev/shm``.

Why: a prefix one worker computed can then be loaded by any worker on the machine, and host
memory holds each block once instead of once per worker.

Layout of the segment: a header (magic, version, slots, block bytes, layout digest, a change
counter), a slot table (per slot: block hash, sequence number, last use, writer pid, state),
then the slots' data. States: FREE, WRITING, READY.

Consistency across processes, with any of them killed at any moment:
  * every change to the table is made under an exclusive ``flock`` on a lock file next to the
    segment; the kernel releases it when its holder dies, so a dead worker never blocks the
    others;
  * a writer claims a slot under the lock (state WRITING, sequence number made odd, its pid),
    copies the block in without the lock, and publishes it under the lock (READY, sequence
    even). A writer killed mid-copy leaves a WRITING slot whose pid is dead: the next writer
    that needs room takes it back. Nothing reads a WRITING slot;
  * readers take no lock (a seqlock; a process's own stores skip the slots it is reading): they read a READY slot's hash and sequence number, copy
    the data, and read them again; if either changed meanwhile the copy is discarded (the
    block is computed instead). So a reader is never blocked and never keeps a wrong copy,
    and a reader's death leaves nothing behind.
Eviction is LRU over ``last use`` (a counter in the header), among READY slots and dead
writers' slots.

The segment outlives the workers (a restarted worker finds the blocks still there); delete
``/dev/shm/interlock-kv-NAME`` (and its ``.lock``) to give the memory back. Its size is fixed by
the first worker that creates it.

Each process keeps a local ``hash -> slot`` map, rebuilt from the table when the header's
change counter moved (one vectorised pass over the table).

Router events: a worker announces the blocks it stores here and the ones it evicts; a block
another worker evicts stays announced for the worker that stored it until a re-sync (the
router's view of a shared tier is approximate; a wrong guess costs one recompute).
"""

from __future__ import annotations

import fcntl
import logging
import mmap
import os
import struct
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from interlock.engine.tiers.pins import Pins
from interlock.errors import ConfigError
from interlock.transfer.staging import pid_alive

log = logging.getLogger(__name__)

MAGIC = b"IKVS"
VERSION = 1
_HEADER = struct.Struct("<4sIQQ16sQQ")
"""magic, version, slots, block bytes, layout digest, change counter, use clock."""
_HEADER_BYTES = 128
_CHANGES_AT = 4 + 4 + 8 + 8 + 16
_CLOCK_AT = _CHANGES_AT + 8
FREE, WRITING, READY = 0, 1, 2
_SLOT = np.dtype([("hash", "<u8"), ("seq", "<u8"), ("used", "<u8"), ("pid", "<u4"), ("state", "<u4")])


@dataclass(frozen=True, slots=True)
class SharedHandle:
    block_hash: int
    slot: int
    seq: int


def segment_path(name: str) -> Path:
    """The segment of a ``host_kv_shared`` name (checked by ``CacheConfig``)."""
    return Path("/dev/shm") / f"interlock-kv-{name}"


class SharedHostTier:
    name = "host"

    def __init__(self, path: Path, num_slots: int, block_nbytes: int, layout: bytes) -> None:
        if num_slots < 1 or block_nbytes < 1:
            raise ValueError("num_slots and block_nbytes must be positive")
        self.path = path
        self.block_nbytes = block_nbytes
        self._lock_fd = os.open(str(path) + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        with self._locked():
            self._map, self.capacity = _open_segment(path, num_slots, block_nbytes, layout)
        if self.capacity != num_slots:
            log.warning(
                "shared KV segment %s has %d slots (asked for %d): its size wins",
                path,
                self.capacity,
                num_slots,
            )
        table_end = _HEADER_BYTES + self.capacity * _SLOT.itemsize
        self._table = np.frombuffer(self._map, dtype=_SLOT, count=self.capacity, offset=_HEADER_BYTES)
        self._data = np.frombuffer(
            self._map, dtype=np.uint8, offset=table_end, count=self.capacity * block_nbytes
        ).reshape(self.capacity, block_nbytes)
        self._header = np.frombuffer(self._map, dtype="<u8", count=2, offset=_CHANGES_AT)
        self._pid = os.getpid()
        self._index: dict[int, int] = {}
        self._seen_changes = -1
        self._pins = Pins()
        """Slots this process is reading: its own stores never take them (other processes'
        may: their reads are checked by the sequence number)."""

    def close(self) -> None:
        self._table = self._data = self._header = None  # type: ignore[assignment]
        self._map.close()
        os.close(self._lock_fd)

    # ---- locking and the local index ----
    @contextmanager
    def _locked(self) -> Iterator[None]:
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _changed(self) -> None:
        self._header[0] += 1

    def _tick(self) -> int:
        self._header[1] += 1
        return int(self._header[1])

    def _refresh(self) -> dict[int, int]:
        changes = int(self._header[0])
        if changes != self._seen_changes:
            t = self._table
            ready = np.flatnonzero(t["state"] == READY)
            self._index = dict(zip(t["hash"][ready].tolist(), ready.tolist(), strict=True))
            self._seen_changes = changes
        return self._index

    # ---- the tier interface (see host.HostTier) ----
    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._refresh()

    def __len__(self) -> int:
        return len(self._refresh())

    def hashes(self) -> list[int]:
        return list(self._refresh())

    def touch(self, block_hash: int) -> None:
        slot = self._refresh().get(block_hash)
        if slot is not None:
            self._table["used"][slot] = self._tick()  # unlocked: an approximate LRU is fine

    def store(
        self, block_hash: int, fill: Callable[[memoryview], None], *, keep_evicted: bool
    ) -> tuple[bool, list[tuple[int, bytes | None]]]:
        t = self._table
        with self._locked():
            live = (t["hash"] == block_hash) & (t["state"] != FREE)
            if live.any():
                t["used"][np.flatnonzero(live)] = self._tick()
                return False, []
            slot = self._victim()
            if slot is None:
                return False, []
            evicted: list[tuple[int, bytes | None]] = []
            if t["state"][slot] == READY:
                evicted.append((int(t["hash"][slot]), self._data[slot].tobytes() if keep_evicted else None))
            t["seq"][slot] += 1 if t["seq"][slot] % 2 == 0 else 2  # odd: being written
            t["hash"][slot], t["pid"][slot], t["state"][slot] = block_hash, self._pid, WRITING
            self._changed()
        try:
            fill(memoryview(self._data[slot]))
        except BaseException:
            with self._locked():
                t["state"][slot], t["seq"][slot] = FREE, t["seq"][slot] + 1
                self._changed()
            raise
        with self._locked():
            t["seq"][slot] += 1
            t["used"][slot] = self._tick()
            t["state"][slot] = READY
            self._changed()
        return True, evicted

    def _victim(self) -> int | None:
        """Under the lock: a free slot, a dead writer's slot, or the least recently used."""
        t = self._table
        free = np.flatnonzero(t["state"] == FREE)
        if len(free):
            return int(free[0])
        for slot in np.flatnonzero(t["state"] == WRITING).tolist():
            if not pid_alive(int(t["pid"][slot])):
                return int(slot)
        ready = np.flatnonzero(t["state"] == READY)
        if self._pins:
            ready = ready[~np.isin(ready, list(self._pins))]
        if not len(ready):
            return None
        return int(ready[np.argmin(t["used"][ready])])

    def remove(self, block_hash: int) -> bool:
        t = self._table
        with self._locked():
            hit = np.flatnonzero((t["hash"] == block_hash) & (t["state"] == READY))
            if not len(hit):
                return False
            slot = int(hit[0])
            t["state"][slot], t["seq"][slot] = FREE, t["seq"][slot] + 2
            self._changed()
        return True

    def clear(self) -> list[int]:
        """Forget every READY block; returns their hashes."""
        return [h for h in self.hashes() if self.remove(h)]

    # ---- lock-free reads ----
    def acquire(self, block_hash: int) -> SharedHandle | None:
        slot = self._refresh().get(block_hash)
        if slot is None:
            return None
        seq = int(self._table["seq"][slot])
        if seq % 2:
            return None
        self.touch(block_hash)
        self._pins.pin(slot)
        return SharedHandle(block_hash, slot, seq)

    def read(self, handle: SharedHandle, sink: Callable[[memoryview], None]) -> bool:
        """Copy the slot out; False (and the copy is to be discarded) if it changed meanwhile."""
        if not self._same(handle):
            return False
        sink(memoryview(self._data[handle.slot]))
        return self._same(handle)

    def read_many(self, handles: Sequence[SharedHandle], sink: Callable[[list[memoryview]], None]) -> int:
        """``read`` of many slots in one ``sink`` call; returns how many leading handles were
        the same before and after the copy (the rest of the copy is to be discarded)."""
        n = next((i for i, h in enumerate(handles) if not self._same(h)), len(handles))
        if n:
            sink([memoryview(self._data[h.slot]) for h in handles[:n]])
        return next((i for i, h in enumerate(handles[:n]) if not self._same(h)), n)

    def _same(self, h: SharedHandle) -> bool:
        row = self._table[h.slot]
        return int(row["seq"]) == h.seq and int(row["hash"]) == h.block_hash and int(row["state"]) == READY

    def release(self, handle: SharedHandle) -> None:
        self._pins.unpin(handle.slot)

    @property
    def num_pinned(self) -> int:
        return len(self._pins)

    def check_integrity(self) -> None:
        t = self._table
        with self._locked():
            state = t["state"].copy()
            ready = t["hash"][state == READY]
            _check(len(np.unique(ready)) == len(ready), "a block is READY in two slots")
            _check(bool(np.all(t["seq"][state == READY] % 2 == 0)), "a READY slot has an odd seq")
            _check(bool(np.all(t["seq"][state == WRITING] % 2 == 1)), "a WRITING slot has an even seq")
            _check(bool(np.all(state <= READY)), "unknown slot state")


def _open_segment(path: Path, num_slots: int, block_nbytes: int, layout: bytes) -> tuple[mmap.mmap, int]:
    """Under the lock: create the segment, or attach to the one there (its size wins)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            slots = num_slots
            size = _HEADER_BYTES + slots * (_SLOT.itemsize + block_nbytes)
            os.ftruncate(fd, size)
            m = mmap.mmap(fd, size)
            m[: _HEADER.size] = _HEADER.pack(MAGIC, VERSION, slots, block_nbytes, layout, 0, 0)
            return m, slots
        m = mmap.mmap(fd, size)
        magic, version, slots, nbytes, lay, _, _ = _HEADER.unpack(m[: _HEADER.size])
        if (magic, version, nbytes, lay) != (MAGIC, VERSION, block_nbytes, layout) or size != (
            _HEADER_BYTES + slots * (_SLOT.itemsize + block_nbytes)
        ):
            m.close()
            raise ConfigError(
                f"shared KV segment {str(path)!r} holds another model's KV layout; "
                "give this deployment its own --host-kv-shared name"
            )
        return m, int(slots)
    finally:
        os.close(fd)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise AssertionError(f"shared host tier: {message}")
