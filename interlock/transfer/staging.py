"""Staging buffers: a header page followed by the payload, in /dev/shm or in private memory.

The source exports KV blocks straight into the payload (its only copy). When the buffer is a
/dev/shm file, a destination on the same host maps the same pages and imports from them (its
only copy); a TCP server sends from the same pages. The header page carries the state that the
two processes share, one writer per word, so no locks cross the process boundary:

    word 0 magic, 1 version, 2 source pid, 3 destination pid,
    word 4 source state (WRITING / READY / ABORTED), 5 destination state (NONE / CLAIMED / DONE
    / ABORTED), words 6-7 payload size.

Leaks: files are named ``interlock-kv-<pid>-<token>``; whoever ends a transfer unlinks the file,
and ``sweep_orphans`` removes files whose creating process is gone (a SIGKILLed source), so
/dev/shm never keeps a dead worker's payloads.
"""

from __future__ import annotations

import mmap
import os
import secrets
from pathlib import Path

SHM_DIR = Path("/dev/shm")
PREFIX = "interlock-kv-"
HEADER_NBYTES = 4096
"""A full page, so the payload is page aligned."""
MAGIC = 0x564B4C49
VERSION = 1

W_MAGIC, W_VERSION, W_SRC_PID, W_DEST_PID, W_SRC_STATE, W_DEST_STATE, W_SIZE_LO, W_SIZE_HI = range(8)
SRC_WRITING, SRC_READY, SRC_ABORTED = 0, 1, 2
DEST_NONE, DEST_CLAIMED, DEST_DONE, DEST_ABORTED = 0, 1, 2, 3

_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs on this host (a zombie counts as dead: it holds nothing)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def shm_available() -> bool:
    return SHM_DIR.is_dir() and os.access(SHM_DIR, os.W_OK)


class Staging:
    """One payload with its header. ``shared``: backed by a /dev/shm file named ``name``."""

    def __init__(self, mem: mmap.mmap, nbytes: int, name: str) -> None:
        self.name = name
        self.nbytes = nbytes
        self._mem: mmap.mmap | None = mem
        self._words: memoryview | None = memoryview(mem)[:32].cast("I")
        self._payload: memoryview | None = memoryview(mem)[HEADER_NBYTES : HEADER_NBYTES + nbytes]

    @property
    def shared(self) -> bool:
        return bool(self.name)

    @classmethod
    def create(cls, nbytes: int, *, shared: bool) -> Staging:
        """A fresh buffer; falls back to private memory when /dev/shm is unusable or full."""
        if shared and shm_available():
            name = f"{PREFIX}{os.getpid()}-{secrets.token_hex(8)}"
            try:
                mem = _map_file(name, HEADER_NBYTES + nbytes, create=True)
            except OSError:
                pass
            else:
                return cls._init_header(cls(mem, nbytes, name))
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _POPULATE
        return cls._init_header(cls(mmap.mmap(-1, HEADER_NBYTES + nbytes, flags=flags), nbytes, ""))

    @classmethod
    def attach(cls, name: str, nbytes: int) -> Staging:
        """Map a source's /dev/shm buffer. Raises OSError (missing) or ValueError (not ours)."""
        if not name.startswith(PREFIX) or "/" in name:
            raise ValueError(f"not a transfer segment: {name!r}")
        st = cls(_map_file(name, None, create=False), nbytes, name)
        if st.word(W_MAGIC) != MAGIC or st.word(W_VERSION) != VERSION or st.size_in_header != nbytes:
            st.release(unlink=False)
            raise ValueError(f"segment {name} does not hold a {nbytes}-byte payload")
        return st

    @staticmethod
    def _init_header(st: Staging) -> Staging:
        st.set_word(W_MAGIC, MAGIC)
        st.set_word(W_VERSION, VERSION)
        st.set_word(W_SRC_PID, os.getpid())
        st.set_word(W_SIZE_LO, st.nbytes & 0xFFFFFFFF)
        st.set_word(W_SIZE_HI, st.nbytes >> 32)
        return st

    @property
    def payload(self) -> memoryview:
        if self._payload is None:
            raise ValueError("staging buffer already released")
        return self._payload

    @property
    def size_in_header(self) -> int:
        return self.word(W_SIZE_LO) | (self.word(W_SIZE_HI) << 32)

    def word(self, i: int) -> int:
        return self._words[i] if self._words is not None else 0

    def set_word(self, i: int, value: int) -> None:
        if self._words is not None:
            self._words[i] = value

    def unlink(self) -> None:
        if self.name:
            try:
                os.unlink(SHM_DIR / self.name)
            except FileNotFoundError:
                pass

    def release(self, *, unlink: bool = True) -> None:
        """Drop the mapping (and the file). Idempotent. Views still held elsewhere (a send in
        progress, a caller's slice) keep the pages alive until they go; the name goes now."""
        if unlink:
            self.unlink()
        for view in (self._payload, self._words):
            try:
                if view is not None:
                    view.release()
            except BufferError:
                pass
        self._payload = self._words = None
        mem, self._mem = self._mem, None
        if mem is not None:
            try:
                mem.close()
            except BufferError:
                pass


def _map_file(name: str, size: int | None, *, create: bool) -> mmap.mmap:
    path = SHM_DIR / name
    fd = os.open(path, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), 0o600)
    try:
        if size is None:
            size = os.fstat(fd).st_size
        else:
            # Reserve the pages now: a full /dev/shm fails here with ENOSPC, not later with SIGBUS.
            os.posix_fallocate(fd, 0, size)
        return mmap.mmap(fd, size, flags=mmap.MAP_SHARED | _POPULATE)
    except BaseException:
        if create:
            os.unlink(path)
        raise
    finally:
        os.close(fd)


def segment_pid(name: str) -> int:
    """The creating process of a segment name, or 0 when the name is not ours."""
    if not name.startswith(PREFIX):
        return 0
    head = name[len(PREFIX) :].split("-", 1)[0]
    return int(head) if head.isdigit() else 0


def list_segments(pid: int | None = None) -> list[str]:
    """Our segment names in /dev/shm, optionally only those created by ``pid``."""
    if not SHM_DIR.is_dir():
        return []
    names = [p.name for p in SHM_DIR.iterdir() if p.name.startswith(PREFIX)]
    return sorted(n for n in names if pid is None or segment_pid(n) == pid)


def sweep_orphans() -> int:
    """Unlink segments whose creating process is gone; returns how many."""
    removed = 0
    for name in list_segments():
        pid = segment_pid(name)
        if pid and not pid_alive(pid):
            try:
                os.unlink(SHM_DIR / name)
                removed += 1
            except FileNotFoundError:
                pass
    return removed
