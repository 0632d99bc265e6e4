"""Staging buffers: a header page followed by the payload, in /dev/shm or in private memory.

The source exports KV blocks straight into the payload (its only copy). When the buffer is a
/dev/shm file, a destination on the same host maps the same pages and imports from them (its
only copy); a TCP server sends from the same pages. The header page carries the state that the
two processes share, one writer per word, so no locks cross the process boundary:

    word 0 magic, 1 version, 2 source pid, 3 destination pid,
    word 4 source state (WRITING / READY / ABORTED), 5 destination state (NONE / CLAIMED / DONE
    / ABORTED), words 6-7 payload size, 8-9 generation (random per use), 10 claim kind (STAGED
    / DIRECT, written before the claim), bytes 48-55: bytes ready, one aligned 64-bit word.

A DIRECT claim (``dest.DirectDest``) is the one copy: the destination copies the blocks straight
from the source's shared KV cache (``TransferDescriptor.cache_region``), so the source exports
nothing into the payload and holds the blocks until the destination stores DONE, or ABORTED, or
the source gives up (timeout, destination dead) and stores ABORTED in word 4 *before* it frees
them. The destination checks word 4 after its copy: not ABORTED then means nothing was freed
before the copy's last read (x86-64 keeps loads in order and stores in order, as below).

Streaming (export and import overlapped): a source may publish before it has written the
payload; it then writes it front to back and advances *bytes ready* after each chunk, and a
destination reads (imports) every byte below it while the rest is being written. The source
is the only writer of the word and only ever raises it within one use; ``prepare`` zeroes it
before it changes the generation, and a reader checks the generation after the word, so a
count of a previous use is never taken for this one.

Why a plain store is a safe publish: the word is one aligned 8-byte word (the header is a page
of its own), which x86-64 reads and writes whole (memoryview's 'Q' item is one 8-byte move).
x86-64 keeps stores in order and loads in order (TSO), so a reader that sees the new count sees
the bytes stored before it; the copy kernel's streaming stores, the one exception, are fenced
(``sfence``) before it returns, i.e. before the count is stored. A reader loads the count, then
the bytes. (A weakly ordered CPU, e.g. aarch64, would need a release store and an acquire load
here; that port is not done.)

A source reuses its buffers (``pool``): on this VM a fresh 64 MiB mapping costs ~10x a copy
of the same bytes, so buffers are recycled after a clean DONE and unlinked after a failure.

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
VERSION = 4

W_MAGIC, W_VERSION, W_SRC_PID, W_DEST_PID, W_SRC_STATE, W_DEST_STATE, W_SIZE_LO, _, W_GEN_LO, _, W_CLAIM = (
    range(11)
)
READY_OFFSET = 48
"""Byte offset of the bytes-ready word (8-byte aligned, outside the 32-bit words above)."""
SRC_WRITING, SRC_READY, SRC_ABORTED = 0, 1, 2
DEST_NONE, DEST_CLAIMED, DEST_DONE, DEST_ABORTED = 0, 1, 2, 3
CLAIM_STAGED, CLAIM_DIRECT = 0, 1

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
    """A mapped buffer of ``capacity`` payload bytes behind a header page; ``shared`` when it is
    the /dev/shm file ``name``. A source reuses it for transfer after transfer (``prepare``);
    each use has a random ``generation`` so a destination never reads a stale use."""

    def __init__(self, mem: mmap.mmap, name: str) -> None:
        self.name = name
        self.capacity = len(mem) - HEADER_NBYTES
        self._mem: mmap.mmap | None = mem
        self._words: memoryview | None = memoryview(mem)[:44].cast("I")
        self._ready: memoryview | None = memoryview(mem)[READY_OFFSET : READY_OFFSET + 8].cast("Q")
        self._body: memoryview | None = memoryview(mem)[HEADER_NBYTES:]
        self._payload: memoryview | None = None

    @property
    def shared(self) -> bool:
        return bool(self.name)

    @classmethod
    def create(cls, capacity: int, *, shared: bool) -> Staging:
        """A fresh buffer; falls back to private memory when /dev/shm is unusable or full."""
        if shared and shm_available():
            name = f"{PREFIX}{os.getpid()}-{secrets.token_hex(8)}"
            try:
                mem = _map_file(name, HEADER_NBYTES + capacity, create=True)
            except OSError:
                pass
            else:
                return cls(mem, name)
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _POPULATE
        return cls(mmap.mmap(-1, HEADER_NBYTES + capacity, flags=flags), "")

    @classmethod
    def attach(cls, name: str) -> Staging:
        """Map a source's /dev/shm buffer. Raises OSError (missing) or ValueError (not ours)."""
        if not name.startswith(PREFIX) or "/" in name:
            raise ValueError(f"not a transfer segment: {name!r}")
        st = cls(_map_file(name, None, create=False), name)
        if st.word(W_MAGIC) != MAGIC or st.word(W_VERSION) != VERSION:
            st.release(unlink=False)
            raise ValueError(f"segment {name} is not a transfer buffer")
        return st

    def prepare(self, nbytes: int) -> int:
        """Start a new use of ``nbytes`` (source side); returns its generation."""
        assert 0 <= nbytes <= self.capacity
        generation = secrets.randbits(63) or 1
        self.set_word(W_SRC_STATE, SRC_WRITING)
        self.set_ready(0)  # before the new generation: no reader pairs an old count with it
        for i, value in (
            (W_MAGIC, MAGIC),
            (W_VERSION, VERSION),
            (W_SRC_PID, os.getpid()),
            (W_DEST_PID, 0),
            (W_CLAIM, CLAIM_STAGED),
            (W_DEST_STATE, DEST_NONE),
        ):
            self.set_word(i, value)
        self._set_pair(W_SIZE_LO, nbytes)
        self._set_pair(W_GEN_LO, generation)
        self._payload = self._sliced(nbytes)
        return generation

    def view_of(self, nbytes: int, generation: int) -> memoryview | str:
        """Destination side: the payload of use ``generation``, or why it cannot be had."""
        if not self.is_use(nbytes, generation):
            return "transfer no longer staged (buffer reused)"
        return self._sliced(nbytes)

    def is_use(self, nbytes: int, generation: int) -> bool:
        """The buffer still holds use ``generation`` (of ``nbytes``)."""
        return self._pair(W_GEN_LO) == generation and self._pair(W_SIZE_LO) == nbytes

    def ready(self) -> int:
        """Bytes ready: the payload's first ``ready()`` bytes are written (see the module note)."""
        return self._ready[0] if self._ready is not None else 0

    def set_ready(self, nbytes: int) -> None:
        """Source side: publish that the first ``nbytes`` payload bytes are written."""
        if self._ready is not None:
            self._ready[0] = nbytes

    @property
    def payload(self) -> memoryview:
        if self._payload is None:
            raise ValueError("staging buffer not prepared or already released")
        return self._payload

    @property
    def nbytes(self) -> int:
        return len(self._payload) if self._payload is not None else 0

    def word(self, i: int) -> int:
        return self._words[i] if self._words is not None else 0

    def set_word(self, i: int, value: int) -> None:
        if self._words is not None:
            self._words[i] = value

    def _pair(self, lo: int) -> int:
        return self.word(lo) | (self.word(lo + 1) << 32)

    def _set_pair(self, lo: int, value: int) -> None:
        self.set_word(lo, value & 0xFFFFFFFF)
        self.set_word(lo + 1, value >> 32)

    def _sliced(self, nbytes: int) -> memoryview:
        if self._body is None:
            raise ValueError("staging buffer already released")
        return self._body[:nbytes]

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
        for view in (self._payload, self._body, self._words, self._ready):
            try:
                if view is not None:
                    view.release()
            except BufferError:
                pass
        self._payload = self._body = self._words = self._ready = None
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
