"""The host-memory tier: KV blocks by block hash in one preallocated buffer, in LRU order.

Idea: a victim cache below the device pool. A block the device pool evicts is copied here
(``store``); when this tier is full its least recently used block makes room and, if a disk
tier is below, leaves with a copy of its bytes for it. A prefix lookup that finds a block here
loads it back into a fresh device block on the I/O thread; while that read runs the slot is
pinned (``acquire``/``release``, both on the engine thread), so no store can overwrite it.

Only the engine thread touches the index. The I/O thread only reads the slot a pin protects
(``read``).

Invariants (``check_integrity``): every slot is either free or holds exactly one hash; the LRU
order lists exactly the held hashes; pins are positive and only on held slots.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from interlock.engine.tiers.pins import Pins


class HostStore(Protocol):
    """What the tier manager needs of a host tier: this private one, or the one shared by the
    workers of a host (``shared.SharedHostTier``)."""

    name: str
    capacity: int

    def __contains__(self, block_hash: int) -> bool: ...
    def __len__(self) -> int: ...
    def hashes(self) -> list[int]: ...
    def touch(self, block_hash: int) -> None: ...
    def store(
        self, block_hash: int, fill: Callable[[memoryview], None], *, keep_evicted: bool
    ) -> tuple[bool, list[tuple[int, bytes | None]]]: ...
    def remove(self, block_hash: int) -> bool: ...
    def clear(self) -> list[int]: ...
    def acquire(self, block_hash: int) -> Any | None: ...
    def read(self, handle: Any, sink: Callable[[memoryview], None]) -> bool: ...
    def read_many(self, handles: Sequence[Any], sink: Callable[[list[memoryview]], None]) -> int: ...
    def release(self, handle: Any) -> None: ...
    @property
    def num_pinned(self) -> int: ...
    def check_integrity(self) -> None: ...
    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class ReadHandle:
    block_hash: int
    slot: int


class HostTier:
    name = "host"

    def __init__(self, num_slots: int, block_nbytes: int) -> None:
        if num_slots < 1 or block_nbytes < 1:
            raise ValueError("num_slots and block_nbytes must be positive")
        self.capacity = num_slots
        self.block_nbytes = block_nbytes
        self._buf = np.zeros((num_slots, block_nbytes), dtype=np.uint8)
        self._flat = self._buf.data.cast("B")
        """The slots' bytes; a slot's view is a slice (a tenth of the cost of a numpy row's
        memoryview, which was a tenth of a block's copy time when onboarding)."""
        self._lru: OrderedDict[int, int] = OrderedDict()
        """hash -> slot, least recently used first."""
        self._free: list[int] = list(range(num_slots - 1, -1, -1))
        self._pins = Pins()

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._lru

    def __len__(self) -> int:
        return len(self._lru)

    def hashes(self) -> list[int]:
        return list(self._lru)

    def touch(self, block_hash: int) -> None:
        self._lru.move_to_end(block_hash)

    def store(
        self, block_hash: int, fill: Callable[[memoryview], None], *, keep_evicted: bool
    ) -> tuple[bool, list[tuple[int, bytes | None]]]:
        """Put a block here, ``fill`` copying its bytes into the slot. Returns (stored, evicted):
        the blocks that made room, with a copy of their bytes when ``keep_evicted``. Not stored
        when every slot is pinned (or already here: then only touched)."""
        if block_hash in self._lru:
            self.touch(block_hash)
            return False, []
        evicted: list[tuple[int, bytes | None]] = []
        if self._free:
            slot = self._free.pop()
        else:
            victim = next((h for h, s in self._lru.items() if s not in self._pins), None)
            if victim is None:
                return False, []
            slot = self._lru.pop(victim)
            evicted.append((victim, self._buf[slot].tobytes() if keep_evicted else None))
        try:
            fill(self._slot(slot))
        except BaseException:
            self._free.append(slot)  # the victim (if any) is gone either way
            raise
        self._lru[block_hash] = slot
        return True, evicted

    def remove(self, block_hash: int) -> bool:
        """Forget a block (its slot becomes free); refused while it is pinned."""
        slot = self._lru.get(block_hash)
        if slot is None or slot in self._pins:
            return False
        del self._lru[block_hash]
        self._free.append(slot)
        return True

    def clear(self) -> list[int]:
        """Forget every unpinned block; returns their hashes."""
        return [h for h in self.hashes() if self.remove(h)]

    # ---- reads for onboarding ----
    def acquire(self, block_hash: int) -> ReadHandle | None:
        """Engine thread: pin the block for a read (and count it as used)."""
        slot = self._lru.get(block_hash)
        if slot is None:
            return None
        self._lru.move_to_end(block_hash)
        self._pins.pin(slot)
        return ReadHandle(block_hash, slot)

    def read(self, handle: ReadHandle, sink: Callable[[memoryview], None]) -> bool:
        """I/O thread: hand the pinned slot's bytes to ``sink``."""
        sink(self._slot(handle.slot))
        return True

    def read_many(self, handles: Sequence[ReadHandle], sink: Callable[[list[memoryview]], None]) -> int:
        """I/O thread: hand the pinned slots' bytes to ``sink`` at once; returns how many of
        the leading handles were read intact (here: all)."""
        size, flat = self.block_nbytes, self._flat
        sink([flat[h.slot * size : (h.slot + 1) * size] for h in handles])
        return len(handles)

    def _slot(self, slot: int) -> memoryview:
        return self._flat[slot * self.block_nbytes : (slot + 1) * self.block_nbytes]

    def release(self, handle: ReadHandle) -> None:
        """Engine thread: the read is over."""
        self._pins.unpin(handle.slot)

    @property
    def num_pinned(self) -> int:
        return len(self._pins)

    def close(self) -> None:
        pass

    def check_integrity(self) -> None:
        slots = list(self._lru.values())
        _check(len(set(slots)) == len(slots), "two hashes share a slot")
        _check(not set(slots) & set(self._free), "a held slot is also free")
        _check(len(slots) + len(self._free) == self.capacity, "slots leaked")
        _check(set(self._pins) <= set(slots), "a free slot is pinned")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise AssertionError(f"host tier: {message}")
