"""Sizes a descent had to turn back from: the SLA policy's memory against flapping.

The SLA policy shrinks a pool when the forecast fits in fewer workers with ``headroom`` and the
last window met the targets. When the capability model's need falls short of the real one by
more than the headroom (the model sees mean lengths; bursts, heavy-tailed prompts and a router
that keeps sessions on their caches it does not see), that removal goes too far: misses follow,
the observed-SLO correction grows the pool back, the correction fades over the next requests
that meet the targets, and the same removal comes again. On a steady load that is a flap every
two windows, for as long as the load holds (the x6 step's long trough; the unit plant in
``tests/planner/test_sla.py``).

So the policy remembers, per pool, the size each removal left relative to the model's need at
that moment (workers per modelled worker). When the pool grows again within ``turn_s`` of a
removal while the load per worker has not risen by more than ``TOLERANCE`` since (the growth
answers the removal, not a rise in the load), that ratio is *refuted* for ``MEMORY_S``: no later
removal leaves the pool under it plus ``TOLERANCE``, relative to the need then. The floor is a ratio, so a
load that keeps falling is not held at a size refuted at a higher one, and a size refuted at a
trough does not hold up the descent of a larger fleet at the next peak.

Pure: the policy feeds it each observation's pool sizes (starting workers counted, draining
ones not) and the model's need.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping

MEMORY_S = 1800.0
"""How long a refuted ratio holds (then the policy may try that size again)."""

TOLERANCE = 0.2
"""A growth counts against the last removal only while the pool's workers per modelled worker
are at least ``1 / (1 + TOLERANCE)`` of what the removal left."""


class TurnMemory:
    def __init__(self, turn_s: float) -> None:
        self.turn_s = turn_s
        self._size: dict[str, int] = {}
        self._removed: dict[str, tuple[float, float]] = {}
        """role -> (time, size over need) of its last removal."""
        self._refuted: dict[str, deque[tuple[float, float]]] = {}
        """role -> (time, ratio) refuted over the last ``MEMORY_S``."""

    def observe(self, now: float, sizes: Mapping[str, int], need: Mapping[str, float]) -> None:
        """``sizes``: each pool's workers now; ``need``: the model's need per pool now."""
        for role, n in sizes.items():
            prev = self._size.get(role)
            self._size[role] = n
            x = need.get(role, 0.0)
            if prev is None or n == prev or not 0 < x < math.inf:
                continue
            if n < prev:
                self._removed[role] = (now, n / x)
                continue
            removed = self._removed.pop(role, None)
            if (
                removed is not None
                and now - removed[0] <= self.turn_s
                and prev / x * (1 + TOLERANCE) >= removed[1]
            ):
                self._refuted.setdefault(role, deque()).append((now, removed[1]))
        for seen in self._refuted.values():
            while seen and seen[0][0] <= now - MEMORY_S:
                seen.popleft()

    def floor(self, role: str) -> float:
        """The largest refuted ratio of the pool (0: none)."""
        return max((r for _, r in self._refuted.get(role, ())), default=0.0)

    def fewest(self, role: str, need: float) -> int:
        """The fewest workers a removal may leave at the model's ``need``: above every refuted
        ratio with ``TOLERANCE`` to spare (a hovering load moves the need by a few percent
        either way; 0: nothing refuted)."""
        r = self.floor(role)
        if not r or not math.isfinite(need):
            return 0
        return math.floor(r * need * (1 + TOLERANCE)) + 1
