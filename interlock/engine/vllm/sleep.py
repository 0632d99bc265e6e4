"""vLLM's own sleep mode for an idle model (``offload_after_s`` on a vLLM worker with CUDA).

After ``offload_after_s`` without a request, ``AsyncLLM.sleep(level=1)`` moves the weights to
host memory and discards the KV cache (vLLM clears its prefix cache first and says so in its KV
events, so the router forgets the worker's blocks); the next request, or the router's prefetch
(``load_weights``), waits for ``wake_up()`` first. vLLM offers it only on CUDA-like devices
(``Platform.is_sleep_mode_available``; ``enable_sleep_mode`` at engine creation, which turns on
its cumem allocator): a vLLM worker on a CPU refuses ``offload_after_s`` by name
(``EngineConfig``).

Ordering: one lock covers going to sleep and waking. The idle loop marks the engine asleep
before it awaits ``sleep`` (a request arriving meanwhile waits on the lock, then wakes it:
vLLM's sleep would abort a request already inside it), and it sleeps only with nothing in
flight. ``weights_load_s`` is the last wake's time (the time going to sleep took until a wake
is timed): what the worker's load reports carry while asleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

log = logging.getLogger(__name__)

SLEEP_LEVEL = 1
"""Weights to host memory, KV cache discarded (level 2 discards the weights too: a wake then
reloads them from disk, which this worker has no way to ask for)."""


class Sleeper:
    def __init__(
        self,
        llm: Any,
        after_s: float,
        on_change: Callable[[], None],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``llm``: vLLM's ``AsyncLLM`` (``sleep``, ``wake_up``); ``on_change``: called after
        each sleep and wake (the adapter publishes a load report)."""
        self._llm = llm
        self.after_s = after_s
        self._on_change = on_change
        self._clock = clock
        self._lock = asyncio.Lock()
        self.asleep = False
        self.in_flight = 0
        self._last_busy = clock()
        self._load_s = 0.0
        self.sleeps = 0
        self.wakes = 0

    @property
    def weights_load_s(self) -> float:
        """Seconds a request waits for the weights (0 while awake; asleep, never under 1 ms)."""
        return max(self._load_s, 1e-3) if self.asleep else 0.0

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[None]:
        """Around one request: the engine is awake inside, and counted busy."""
        self.in_flight += 1
        try:
            await self.wake()
            yield
        finally:
            self.in_flight -= 1
            self._last_busy = self._clock()

    async def wake(self) -> float:
        """Wake vLLM if it sleeps; seconds it took (0: it was awake)."""
        if not self.asleep:
            return 0.0
        async with self._lock:
            if not self.asleep:
                return 0.0
            t0 = time.perf_counter()
            await self._llm.wake_up()
            self._load_s = time.perf_counter() - t0
            self.asleep = False
            self.wakes += 1
            self._last_busy = self._clock()
        log.info("vLLM woke up in %.2f s", self._load_s)
        self._on_change()
        return self._load_s

    def due(self) -> bool:
        return not self.asleep and not self.in_flight and self._clock() - self._last_busy >= self.after_s

    async def sleep_if_due(self) -> bool:
        """Put vLLM to sleep if it has been idle ``after_s``; True if it went to sleep."""
        if not self.due():
            return False
        async with self._lock:
            if not self.due():
                return False
            self.asleep = True  # a request arriving now waits on the lock, then wakes it
            t0 = time.perf_counter()
            try:
                await self._llm.sleep(level=SLEEP_LEVEL)
            except Exception:
                self.asleep = False
                raise
            if not self.wakes:  # until a wake is timed, the way down estimates the way up
                self._load_s = time.perf_counter() - t0
            self.sleeps += 1
        log.info("vLLM asleep after %.0f s idle (weights in host memory)", self.after_s)
        self._on_change()
        return True

    async def run(self, poll_s: float = 1.0) -> None:
        """The idle loop (a task of the adapter's): checks every ``poll_s`` at most."""
        while True:
            await asyncio.sleep(min(poll_s, self.after_s))
            try:
                await self.sleep_if_due()
            except Exception:  # noqa: BLE001 - a failed sleep leaves the engine awake, serving
                log.warning("vLLM could not go to sleep", exc_info=True)
                self._last_busy = self._clock()


__all__ = ["SLEEP_LEVEL", "Sleeper"]
