"""Routing policies and the two stickiness tables (session affinity, route-key subsets).

Base policies pick one worker among the eligible ones (healthy, not draining, right role):

* ``kv`` (default): lowest estimated time to first token (``cost.ttft_costs``);
* ``round-robin``, ``random``;
* ``least-loaded``: fewest in-flight requests, then least queued prefill;
* ``power-of-two``: two random workers, the less loaded of the two.

Overlays applied before the base policy, by request metadata:

* direct: ``worker_id`` pins a worker (it must be eligible);
* session affinity: a ``session_id`` sticks to the worker it first went to for ``ttl_s`` after
  its last use, unless that worker is busy or gone;
* ``route_key``: the key picks a consistent subset of ``subset_size`` workers by rendezvous
  hashing (adding or removing a worker moves only the keys it owned); the base policy picks
  within the subset, and when the whole subset is loaded past ``spill_factor`` times the mean,
  the request spills over to all workers, so a coarse key cannot overload its subset.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import xxhash

from interlock.names import POLICIES  # noqa: F401 - re-exported (router.POLICIES)


@dataclass(slots=True)
class _Sticky:
    worker_id: str
    expires: float


class SessionTable:
    """session id -> worker, with a TTL refreshed on each use."""

    def __init__(self, ttl_s: float = 600.0, max_sessions: int = 100_000) -> None:
        self.ttl_s = ttl_s
        self.max_sessions = max_sessions
        self._table: dict[str, _Sticky] = {}

    def get(self, session_id: str, now: float) -> str | None:
        s = self._table.get(session_id)
        if s is None:
            return None
        if s.expires <= now:
            del self._table[session_id]
            return None
        return s.worker_id

    def put(self, session_id: str, worker_id: str, now: float) -> None:
        if len(self._table) >= self.max_sessions and session_id not in self._table:
            self._evict_expired(now)
            if len(self._table) >= self.max_sessions:
                # Still full: drop the oldest insertion (dicts keep insertion order).
                del self._table[next(iter(self._table))]
        self._table.pop(session_id, None)
        self._table[session_id] = _Sticky(worker_id, now + self.ttl_s)

    def forget_worker(self, worker_id: str) -> None:
        for k in [k for k, s in self._table.items() if s.worker_id == worker_id]:
            del self._table[k]

    def _evict_expired(self, now: float) -> None:
        for k in [k for k, s in self._table.items() if s.expires <= now]:
            del self._table[k]

    def __len__(self) -> int:
        return len(self._table)


def rendezvous_subset(key: str, worker_ids: Sequence[str], k: int) -> list[str]:
    """The ``k`` workers with the highest hash(key, worker): stable as workers come and go."""
    scored = sorted(worker_ids, key=lambda w: xxhash.xxh64_intdigest(f"{key}\x00{w}".encode()), reverse=True)
    return scored[:k]


def should_spill(subset_busy: np.ndarray, all_busy: np.ndarray, spill_factor: float) -> bool:
    """True when every subset member carries more than ``spill_factor`` x the mean load (+1,
    so an idle cluster never spills)."""
    if len(subset_busy) == 0:
        return True
    return float(subset_busy.min()) > spill_factor * float(all_busy.mean()) + 1.0


def pick_simple(
    policy: str,
    eligible: np.ndarray,
    busy: np.ndarray,
    queued: np.ndarray,
    rng: np.random.Generator,
    rotation: int,
) -> int:
    """Slot chosen by a non-``kv`` base policy."""
    idx = np.flatnonzero(eligible)
    if policy == "round-robin":
        return int(idx[rotation % len(idx)])
    if policy == "random":
        return int(idx[rng.integers(len(idx))])
    if policy == "power-of-two":
        if len(idx) == 1:
            return int(idx[0])
        a, b = rng.choice(idx, size=2, replace=False)
        key_a, key_b = (busy[a], queued[a]), (busy[b], queued[b])
        return int(a if key_a <= key_b else b)
    if policy == "least-loaded":
        b = busy[idx]
        idx = idx[b == b.min()]
        q = queued[idx]
        idx = idx[q == q.min()]
        return int(idx[rotation % len(idx)])
    raise ValueError(f"unknown policy {policy!r}")
