"""The disk tier: one file per KV block under a directory, in LRU order.

Files are written atomically (a temporary file in the same directory, then ``os.replace``) and
begin with a header: magic, format version, the block's hash, a digest of the KV layout (model,
dtype, block size: a file from another layout is never read as this one), the payload size and
an XXH3-128 checksum of the payload. A read that finds anything unexpected (short file, other
hash or layout, checksum mismatch) returns None, and the block is computed again. So a crash
at any moment leaves at worst a stray temporary file (removed at the next start) or a file
that fails its check: nothing is read back wrong. No fsync: durability is not needed for a
cache, only the guarantee that what is read back is right, which the checksum gives.

Only the engine thread touches the index; file work runs as jobs on the tier I/O thread
(``TierIO``, in submission order: a block's write, reads and deletion happen in that order).
A write counts against the capacity at once and becomes readable when its job is seen done.
Workers of one host may share the configured path: each takes the first ``slot-N``
subdirectory whose lock (``flock``, released by the kernel when a worker dies) is free, so a
restarted worker reuses (and first empties) a dead one's directory.

A block a queued read needs is pinned (``acquire``/``release``): never evicted meanwhile.

A full file system (ENOSPC, EDQUOT: other files, or a size larger than the disk) costs no
request: the failed write leaves no file (its temporary one is removed, else it would keep the
space), the block is forgotten and counted (``write_failures``), and the tier then keeps as
many blocks as it holds (``room``), evicting old blocks for new ones as if it were that size.
Each time it has written as many blocks as it keeps, ``room`` grows by one (back up to
``capacity``), so space freed meanwhile is found again at one failed write per turnover.

Invariants (``check_integrity``): the index holds at most ``room`` <= ``capacity`` blocks;
every entry is WRITING (its job pending) or READY; pending writes are exactly the WRITING
entries; pins are positive and on READY entries only.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import struct
from collections import OrderedDict
from pathlib import Path

import xxhash

from interlock.engine.tiers.io import Job, TierIO
from interlock.engine.tiers.pins import Pins
from interlock.errors import ConfigError

log = logging.getLogger(__name__)

MAGIC = b"IKV1"
VERSION = 1
_HEADER = struct.Struct("<4sIQ16sQ16s")
"""magic, version, block hash, layout digest, payload bytes, payload checksum."""
HEADER_BYTES = _HEADER.size

WRITING, READY = 0, 1


def layout_digest(layout: str) -> bytes:
    return xxhash.xxh3_128(layout.encode()).digest()


def block_name(block_hash: int) -> str:
    return f"{block_hash:016x}.kv"


def block_path(directory: Path, block_hash: int) -> Path:
    return directory / block_name(block_hash)


def write_block(directory: Path, block_hash: int, layout: bytes, data: bytes | memoryview) -> None:
    """Write one block file atomically (temporary file, then rename)."""
    payload = memoryview(data).cast("B")
    header = _HEADER.pack(
        MAGIC, VERSION, block_hash, layout, payload.nbytes, xxhash.xxh3_128(payload).digest()
    )
    final = block_path(directory, block_hash)
    tmp = final.with_suffix(f".{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(header)
            f.write(payload)
        os.replace(tmp, final)
    except BaseException:
        # A full disk fails part-way through: what was written must not keep the space (on a
        # tmpfs, nothing else would ever free it).
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_block(
    directory: Path, block_hash: int, layout: bytes, nbytes: int, scratch: bytearray | None = None
) -> memoryview | None:
    """The payload of a block file, or None if it is missing or fails any check.

    One read of the whole file into ``scratch`` (reused by the caller: a fresh buffer per block
    cost page faults and zeroing, ~1/3 of the time), one byte larger than a valid file so that a
    longer file shows; the payload returned is a view of it, valid until the next read."""
    want = HEADER_BYTES + nbytes
    buf = scratch if scratch is not None and len(scratch) > want else bytearray(want + 1)
    view = memoryview(buf)[: want + 1]
    got = 0
    try:
        # os-level calls: a Python file object cost about as much as the read itself here.
        fd = os.open(os.path.join(directory, block_name(block_hash)), os.O_RDONLY)
        try:
            while got <= want:
                step = os.readv(fd, [view[got:]])
                if not step:
                    break
                got += step
        finally:
            os.close(fd)
    except OSError:
        return None
    if got != want:
        return None
    magic, version, h, lay, size, digest = _HEADER.unpack_from(buf)
    if (magic, version, h, lay, size) != (MAGIC, VERSION, block_hash, layout, nbytes):
        return None
    payload = view[HEADER_BYTES:want]
    if xxhash.xxh3_128(payload).digest() != digest:
        return None
    return payload


def delete_block(directory: Path, block_hash: int) -> None:
    try:
        os.unlink(block_path(directory, block_hash))
    except FileNotFoundError:
        pass


class DiskTier:
    name = "disk"

    def __init__(self, directory: Path, capacity: int, block_nbytes: int, layout: str, io: TierIO) -> None:
        if capacity < 1:
            raise ValueError("disk tier capacity must be positive")
        self.capacity = capacity
        self.block_nbytes = block_nbytes
        self.layout = layout_digest(layout)
        self.io = io
        self._lru: OrderedDict[int, int] = OrderedDict()
        """hash -> WRITING or READY, least recently used first."""
        self._writes: dict[int, Job[None]] = {}
        self._pins = Pins()
        """Blocks a queued read needs: not evicted until ``release``."""
        self.write_failures = 0
        self.room = capacity
        """Blocks kept: ``capacity``, or what fit when the file system ran out of space."""
        self._fits = 0
        """Writes that succeeded since ``room`` last changed."""
        self.directory, fd = _claim_directory(directory)
        self._lock_fd: int | None = fd
        _clean(self.directory)

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def __contains__(self, block_hash: int) -> bool:
        return self._lru.get(block_hash) == READY

    def __len__(self) -> int:
        return len(self._lru)

    def hashes(self) -> list[int]:
        return [h for h, s in self._lru.items() if s == READY]

    def is_writing(self, block_hash: int) -> bool:
        return self._lru.get(block_hash) == WRITING

    @property
    def num_writing(self) -> int:
        return len(self._writes)

    def touch(self, block_hash: int) -> None:
        self._lru.move_to_end(block_hash)

    def put(self, block_hash: int, data: bytes) -> tuple[bool, list[int]]:
        """Start writing a block; returns (started, READY blocks evicted to make room)."""
        if block_hash in self._lru:
            self.touch(block_hash)
            return False, []
        evicted: list[int] = []
        while len(self._lru) >= self.room:
            pins = self._pins
            victim = next((h for h, s in self._lru.items() if s == READY and h not in pins), None)
            if victim is None:
                return False, evicted  # every entry is being written or read
            del self._lru[victim]
            self._submit_delete(victim)
            evicted.append(victim)
        d, lay = self.directory, self.layout
        self._writes[block_hash] = self.io.submit(lambda: write_block(d, block_hash, lay, data))
        self._lru[block_hash] = WRITING
        return True, evicted

    def poll(self) -> tuple[list[int], list[int]]:
        """Engine thread: finished writes become readable. Returns (now READY, failed)."""
        ready: list[int] = []
        failed: list[int] = []
        for h, job in list(self._writes.items()):
            if not job.done:
                continue
            del self._writes[h]
            if job.error is not None:
                self.write_failures += 1
                del self._lru[h]
                self._submit_delete(h)
                failed.append(h)
                if _is_full(job.error):
                    self._shrink()
                else:
                    log.warning("writing KV block %016x to %s failed: %s", h, self.directory, job.error)
            else:
                self._lru[h] = READY
                ready.append(h)
                self._grow()
        return ready, failed

    def _shrink(self) -> None:
        """The file system is full (other files, or a size larger than it): keep what is here
        and make room for new blocks by evicting old ones, as if the tier were this size."""
        room = max(1, len(self._lru))
        if room < self.room:
            log.warning(
                "disk KV tier %s is full: keeping %d blocks (of %d configured)",
                self.directory,
                room,
                self.capacity,
            )
        self.room, self._fits = min(room, self.room), 0

    def _grow(self) -> None:
        """One block more each time the tier has written as many as it keeps."""
        if self.room >= self.capacity:
            return
        self._fits += 1
        if self._fits >= self.room:
            self.room, self._fits = self.room + 1, 0

    def reader(self, block_hash: int) -> tuple[Path, int, bytes, int]:
        """What a read job needs (the index is not touched off the engine thread)."""
        self._lru.move_to_end(block_hash)
        return self.directory, block_hash, self.layout, self.block_nbytes

    def acquire(self, block_hash: int) -> tuple[Path, int, bytes, int]:
        """Engine thread: pin a READY block for a read job (``reader``'s arguments)."""
        self._pins.pin(block_hash)
        return self.reader(block_hash)

    def release(self, block_hash: int) -> None:
        self._pins.unpin(block_hash)

    @property
    def num_pinned(self) -> int:
        return self._pins.reads()

    def remove(self, block_hash: int) -> bool:
        if self._lru.get(block_hash) != READY or block_hash in self._pins:
            return False
        del self._lru[block_hash]
        self._submit_delete(block_hash)
        return True

    def clear(self) -> list[int]:
        """Forget every readable block not pinned; returns their hashes."""
        return [h for h in self.hashes() if self.remove(h)]

    def _submit_delete(self, block_hash: int) -> None:
        d = self.directory
        self.io.submit(lambda: delete_block(d, block_hash))

    def check_integrity(self) -> None:
        _check(len(self._lru) <= self.room <= self.capacity, "over capacity")
        writing = {h for h, s in self._lru.items() if s == WRITING}
        _check(writing == set(self._writes), "pending writes out of step with the index")
        _check(all(s in (WRITING, READY) for s in self._lru.values()), "unknown state")
        _check(
            all(self._lru.get(h) == READY for h in self._pins),
            "a pin on a block that is not readable",
        )


_MAX_SLOTS = 1024


def _claim_directory(base: Path) -> tuple[Path, int]:
    """The first ``base/slot-N`` no live worker holds, locked; (directory, lock fd)."""
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"disk KV path {str(base)!r} is not usable: {exc}") from exc
    for n in range(_MAX_SLOTS):
        directory = base / f"slot-{n}"
        try:
            directory.mkdir(exist_ok=True)
            fd = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise ConfigError(f"disk KV path {str(base)!r} is not usable: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        return directory, fd
    raise ConfigError(f"disk KV path {str(base)!r}: all {_MAX_SLOTS} worker slots are in use")


def _clean(directory: Path) -> None:
    """Start empty: remove block and temporary files a previous run left (a cache, not a store;
    the next run may serve another model or dtype)."""
    for p in directory.iterdir():
        if p.suffix in (".kv", ".tmp"):
            p.unlink(missing_ok=True)


def _is_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise AssertionError(f"disk tier: {message}")
