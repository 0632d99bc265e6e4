"""A subscription: an async iterator over ``(subject, payload)`` fed by a transport callback.

Unbounded on purpose: KV events must not be dropped by the process (a subscriber that falls
behind is a bug to see in memory, not a silent gap in the router's index).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

_CLOSED = ("", b"")


class Subscription:
    def __init__(self, subject: str, on_close: Callable[[], Awaitable[None]] | None = None) -> None:
        self.subject = subject
        self._queue: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue()
        self._on_close = on_close
        self._closed = False
        self._owner: Subscriptions | None = None

    def deliver(self, subject: str, payload: bytes) -> None:
        """Called by the transport for each matching message."""
        if not self._closed:
            self._queue.put_nowait((subject, payload))

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> tuple[str, bytes]:
        if self._closed and self._queue.empty():
            raise StopAsyncIteration
        item = await self._queue.get()
        if item is _CLOSED:
            raise StopAsyncIteration
        return item

    async def close(self) -> None:
        """Stop receiving; a pending ``__anext__`` ends the iteration."""
        if self._closed:
            return
        self._closed = True
        self._queue.put_nowait(_CLOSED)
        if self._owner is not None:  # a closed one is not kept (a shard opens one per worker)
            self._owner.discard(self)
        if self._on_close is not None:
            await self._on_close()

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class Subscriptions:
    """The subscriptions one event plane opened: all closed when the plane closes."""

    def __init__(self) -> None:
        self._open: dict[Subscription, None] = {}

    def add(self, sub: Subscription) -> Subscription:
        self._open[sub] = None
        sub._owner = self
        return sub

    def discard(self, sub: Subscription) -> None:
        self._open.pop(sub, None)

    def __len__(self) -> int:
        return len(self._open)

    async def close(self) -> None:
        for sub in list(self._open):
            await sub.close()
        self._open.clear()
