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
from collections.abc import AsyncGenerator, Awaitable, Callable
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


Opened = tuple[Channel[Item], Callable[[], object]]
"""A call's channel and how to cancel the call on the server."""


async def drain(open_call: Callable[[], Awaitable[Opened]]) -> AsyncGenerator[bytes, None]:
    """A call's chunks as they come, until its clean end or the error that ends it; a reader
    that stops first (the client gone) cancels the call on the server. ``open_call`` runs on
    the first ``anext``, so an iterator never started opens nothing."""
    channel, cancel = await open_call()
    finished = False
    try:
        while True:
            item = await channel.get()
            if type(item) is bytes:
                yield item
            elif item is None:
                finished = True
                return
            else:
                finished = True
                raise item  # type: ignore[misc]
    finally:
        if not finished:
            cancel()
