"""Which worker to give up: the one whose loss costs least.

Losing a worker costs the work it holds (in-flight requests must finish there or move) and the
cache only it holds (prefixes nobody else has must be recomputed elsewhere). Both are counted in
in-flight requests: ``cost = in_flight + cache_block_cost * unique_blocks``; a worker still
starting costs nothing. Ties go to the youngest worker (least warmed up), then by id, so the
choice is deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence

from interlock.planner.state import WorkerView


def removal_cost(w: WorkerView, cache_block_cost: float) -> float:
    if not w.ready:
        return 0.0
    return w.in_flight + cache_block_cost * w.unique_blocks


def _key(w: WorkerView, cache_block_cost: float) -> tuple[float, float, str]:
    return removal_cost(w, cache_block_cost), w.age_s, w.worker_id


def cheapest(workers: Sequence[WorkerView], cache_block_cost: float) -> WorkerView:
    """The worker whose loss costs least (``workers`` must not be empty)."""
    return min(workers, key=lambda w: _key(w, cache_block_cost))


def cheapest_first(workers: Sequence[WorkerView], cache_block_cost: float) -> list[WorkerView]:
    """The workers, the one whose loss costs least first."""
    return sorted(workers, key=lambda w: _key(w, cache_block_cost))
