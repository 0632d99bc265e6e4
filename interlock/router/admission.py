"""Bounded priority queue for requests that arrive while every worker is busy.

Lower ``priority`` value first (the meaning of priority is defined once, in
``interlock.protocol.generate``), first-come first within a priority. Past ``capacity`` a new request
is rejected with ``Overloaded`` (503 + Retry-After) rather than queued without bound: a queue
longer than a few service times only converts overload into timeouts.

One queue holds requests for every role (a disaggregated request may wait for a prefill
worker, then for a decode worker while it holds the prefill one); ``roles`` says which roles
have requests waiting, so the router can pass over those whose workers are all busy.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from interlock.errors import Overloaded


@dataclass(frozen=True, slots=True)
class RequestMeta:
    """What the router needs to know about one request (built by the frontend)."""

    request_id: str
    prompt_tokens: int
    max_tokens: int = 0
    """Expected output tokens (max_tokens), 0 if unknown."""
    priority: int = 0
    """Lower is served first (``interlock.protocol.generate``)."""
    session_id: str | None = None
    route_key: str | None = None
    worker_id: str | None = None
    """Pin to this worker (direct routing)."""
    role: str | None = None
    """Only workers of this role ("both", "prefill", "decode"); None: any."""


@dataclass(order=True, slots=True)
class Pending:
    sort_key: tuple[int, int]
    meta: RequestMeta = field(compare=False)
    hashes: Sequence[int] = field(compare=False)
    enqueued_at: float = field(compare=False, default=0.0)


class AdmissionQueue:
    def __init__(self, capacity: int = 1024, retry_after_s: float = 1.0) -> None:
        self.capacity = capacity
        self.retry_after_s = retry_after_s
        self._heap: list[Pending] = []
        self._cancelled: set[str] = set()
        self._ids: dict[str, str | None] = {}
        """Waiting request id -> its role."""
        self._roles: dict[str | None, int] = {}
        """Role -> requests of it waiting (no zero counts)."""
        self._counter = itertools.count()

    def __len__(self) -> int:
        return len(self._ids)

    def push(self, meta: RequestMeta, hashes: Sequence[int], now: float) -> Pending:
        if len(self._ids) >= self.capacity:
            raise Overloaded(
                f"all workers busy and {len(self._ids)} requests already waiting",
                retry_after=self.retry_after_s,
            )
        p = Pending((meta.priority, next(self._counter)), meta, hashes, now)
        heapq.heappush(self._heap, p)
        self._add(meta)
        return p

    def roles(self) -> set[str | None]:
        """The roles (``RequestMeta.role``) of the requests waiting."""
        return set(self._roles)

    def peek(self) -> Pending | None:
        self._drop_cancelled()
        return self._heap[0] if self._heap else None

    def pop(self) -> Pending:
        self._drop_cancelled()
        p = heapq.heappop(self._heap)
        self._remove(p.meta.request_id)
        return p

    def requeue(self, p: Pending) -> None:
        """Put back a request taken with ``pop`` (it keeps its place; no capacity check)."""
        heapq.heappush(self._heap, p)
        self._add(p.meta)

    def cancel(self, request_id: str) -> bool:
        if request_id not in self._ids:
            return False
        self._remove(request_id)
        self._cancelled.add(request_id)
        return True

    def _add(self, meta: RequestMeta) -> None:
        self._ids[meta.request_id] = meta.role
        self._roles[meta.role] = self._roles.get(meta.role, 0) + 1

    def _remove(self, request_id: str) -> None:
        role = self._ids.pop(request_id)
        left = self._roles[role] - 1
        if left:
            self._roles[role] = left
        else:
            del self._roles[role]

    def _drop_cancelled(self) -> None:
        while self._heap and self._heap[0].meta.request_id in self._cancelled:
            self._cancelled.discard(heapq.heappop(self._heap).meta.request_id)
