"""The per-call channel from a transport callback to the client's iterator.

A deque and at most one waiting future: lighter than ``asyncio.Queue`` (whose bookkeeping was a
quarter of the client's time per token), and it lets the reader take every chunk that arrived
in one event-loop turn without suspending in between. A call's channel carries chunks, then
``None`` (clean end) or the exception that ends the call. The engine's per-request output
streams use the same class (``Channel[GenerateOutput]``).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")
Item = bytes | Exception | None


class Channel(Generic[T]):
    """Single-reader queue on one event loop (``put`` from that loop only)."""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: deque[T] = deque()
        self._waiter: asyncio.Future[None] | None = None

    def put(self, item: T) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> T:
        items = self._items
        while not items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return items.popleft()
