"""Bounded priority queue for requests that arrive while every worker is busy.

Lower ``priority`` value first (the meaning of priority is defined once, in
``interlock.protocol.generate``), first-come first within a priority. Past ``capacity`` a new request
is rejected with ``Overloaded`` (503 + Retry-After) rather than queued without bound: a queue
longer than a few service times only converts overload into timeouts.

One queue holds requests for every role (a disaggregated request may wait for a prefill
worker, then for a decode worker while it holds the prefill one), one heap per role inside;
``roles`` says which roles have requests waiting, and ``peek``/``pop`` pass over the roles the
router names (those whose workers are all busy) without touching their requests.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Collection, Sequence
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
        self._heaps: dict[str | None, list[Pending]] = {}
        """One heap per role: passing over a role whose workers are all busy costs nothing
        per request of it (one heap of all of them was popped and pushed back whole)."""
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
        heapq.heappush(self._heaps.setdefault(meta.role, []), p)
        self._add(meta)
        return p

    def roles(self) -> set[str | None]:
        """The roles (``RequestMeta.role``) of the requests waiting."""
        return set(self._roles)

    def peek(self, skip: Collection[str | None] = ()) -> Pending | None:
        """The first request waiting, of a role not in ``skip``."""
        best: Pending | None = None
        for role, heap in self._heaps.items():
            if role in skip:
                continue
            self._drop_cancelled(heap)
            if heap and (best is None or heap[0] < best):
                best = heap[0]
        return best

    def pop(self, skip: Collection[str | None] = ()) -> Pending:
        """Take the request ``peek(skip)`` names (IndexError when there is none)."""
        p = self.peek(skip)
        if p is None:
            raise IndexError("no request waiting")
        heapq.heappop(self._heaps[p.meta.role])
        self._remove(p.meta.request_id)
        return p

    def requeue(self, p: Pending) -> None:
        """Put back a request taken with ``pop`` (it keeps its place; no capacity check)."""
        heapq.heappush(self._heaps.setdefault(p.meta.role, []), p)
        self._add(p.meta)

    def cancel(self, request_id: str) -> bool:
        if request_id not in self._ids:
            return False
        self._remove(request_id)
        self._cancelled.add(request_id)
        return True

    def take_roles(self, roles: set[str | None]) -> list[RequestMeta]:
        """Take every waiting request of these roles out of the queue (as ``cancel`` does)."""
        metas = [
            p.meta
            for role in roles
            for p in self._heaps.get(role, ())
            if self._ids.get(p.meta.request_id, "?") == role
        ]
        for meta in metas:
            self.cancel(meta.request_id)
        return metas

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

    def _drop_cancelled(self, heap: list[Pending]) -> None:
        while heap and heap[0].meta.request_id in self._cancelled:
            self._cancelled.discard(heapq.heappop(heap).meta.request_id)
