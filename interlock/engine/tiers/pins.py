"""Reference counts of tier slots being read: a pinned slot is never evicted nor reused.

One definition for every tier: the host tier and the shared host tier pin slots, the disk tier
block hashes. A slot is in the table exactly while its count is positive, so ``in`` and ``len``
answer "pinned?" and "how many?" directly.
"""

from __future__ import annotations

from collections.abc import Iterator


class Pins:
    __slots__ = ("_counts",)

    def __init__(self) -> None:
        self._counts: dict[int, int] = {}

    def pin(self, slot: int) -> None:
        self._counts[slot] = self._counts.get(slot, 0) + 1

    def unpin(self, slot: int) -> None:
        """One read of ``slot`` is over (KeyError if it was not pinned: a caller's bug)."""
        n = self._counts[slot] - 1
        if n:
            self._counts[slot] = n
        else:
            del self._counts[slot]

    def __contains__(self, slot: object) -> bool:
        return slot in self._counts

    def __len__(self) -> int:
        return len(self._counts)

    def __iter__(self) -> Iterator[int]:
        return iter(self._counts)

    def reads(self) -> int:
        """Reads in progress: a slot pinned twice counts twice."""
        return sum(self._counts.values())
