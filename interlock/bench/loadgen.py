"""The load generator: issue prompts by a plan, bounded by a request count and a duration.

Two ways to pace requests:

* **closed loop** (``concurrency = N``, no offsets): N workers, each sends its next request as
  soon as its previous one ends;
* **open loop** (``offsets``): request ``i`` is sent ``offsets[i]`` seconds after the start
  (fixed rate with constant or Poisson gaps, or a trace's scaled timestamps), whether or not
  earlier requests have finished; ``concurrency`` then optionally caps requests in flight (a
  capped request waits, and its ``start_s`` later than ``scheduled_s`` shows by how much).

Bounds, always both: at most ``max_requests`` requests, none sent after ``duration_s``; requests
still running then get ``grace_s`` more to finish and are cancelled after that (recorded with
error ``cancelled``). The next prompt is built before sleeping until its send time, so building
long prompts does not delay sends.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import aiohttp

from interlock.bench.client import Endpoint, RequestRecord, request_body, send_request
from interlock.bench.progress import Progress
from interlock.bench.prompts import Prompt
from interlock.bench.server_metrics import ServerFigures
from interlock.errors import ConfigError


@dataclass(frozen=True)
class Bounds:
    max_requests: int
    duration_s: float
    grace_s: float = 30.0

    def validate(self) -> None:
        if self.max_requests < 1 or self.duration_s <= 0 or self.grace_s < 0:
            raise ConfigError("need --num-requests >= 1, --duration > 0 and --grace >= 0")


@dataclass(frozen=True)
class LoadPlan:
    label: str
    load: dict[str, Any]
    """What the run was (mode, value, arrival...): saved with the results."""
    prompt: Callable[[int], Prompt]
    count: int
    """Prompts available (a trace's length); the run sends at most min(count, max_requests)."""
    offsets: Sequence[float] | None = None
    concurrency: int | None = None


@dataclass
class RunResult:
    label: str
    load: dict[str, Any]
    started_at: str
    duration_s: float
    records: list[RequestRecord] = field(default_factory=list)
    server: ServerFigures | None = None
    """What the server's own metrics counted during the run (None: it serves none)."""


async def run_load(
    endpoint: Endpoint, plan: LoadPlan, bounds: Bounds, *, progress: bool = False
) -> RunResult:
    n = min(plan.count, bounds.max_requests)
    if plan.offsets is None and not plan.concurrency:
        raise ConfigError("a plan needs send offsets or a concurrency")
    bar = Progress(n, plan.label, enabled=progress)
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    try:
        async with aiohttp.ClientSession(connector=connector) as session:
            run = _Run(endpoint, session, plan, n, bounds, bar)
            duration = await run.go()
    finally:
        bar.close()
    records = sorted(run.records, key=lambda r: r.index)
    return RunResult(plan.label, plan.load, started_at, duration, records)


async def warm_up(endpoint: Endpoint, plan: LoadPlan, n: int, timeout_s: float) -> list[RequestRecord]:
    """Send ``n`` requests one after another before a run, not counted in it, each given at
    most ``timeout_s``.

    The first requests of a process pay one-off costs on both sides (connection set-up, lazy
    imports, a server's first-step compilation): measured on loopback, tens of milliseconds.
    """
    endpoint = replace(endpoint, request_timeout_s=min(endpoint.request_timeout_s, timeout_s))
    records = []
    async with aiohttp.ClientSession() as session:
        for i in range(n):
            body, _ = _Run.build(endpoint, plan, i)
            records.append(await send_request(session, endpoint, body, RequestRecord(index=i, start_s=0.0)))
    return records


class _Run:
    def __init__(
        self,
        endpoint: Endpoint,
        session: aiohttp.ClientSession,
        plan: LoadPlan,
        n: int,
        bounds: Bounds,
        bar: Progress,
    ) -> None:
        self.endpoint, self.session, self.plan, self.n, self.bar = endpoint, session, plan, n, bar
        self.records: list[RequestRecord] = []
        self.t0 = time.perf_counter()
        self.deadline = self.t0 + bounds.duration_s
        self.hard_stop = self.deadline + bounds.grace_s
        self._next = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def go(self) -> float:
        if self.plan.offsets is None:
            workers = max(1, min(self.plan.concurrency or 1, self.n))
            for _ in range(workers):
                self._spawn(self._worker())
        else:
            await self._schedule(self.plan.offsets)
        while self._tasks:  # workers and requests; new requests may join while we wait
            remaining = self.hard_stop - time.perf_counter()
            if remaining <= 0:
                break
            await asyncio.wait(set(self._tasks), timeout=remaining)
        await self._cancel_all()
        end = max((self.t0 + r.start_s + (r.e2e_s or 0.0) for r in self.records), default=self.t0)
        return max(end - self.t0, 1e-9)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _cancel_all(self) -> None:
        pending = list(self._tasks)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def _worker(self) -> None:
        while self._next < self.n and time.perf_counter() < self.deadline:
            index = self._next
            self._next += 1
            body, prompt = self._build(index)
            await self._one(index, None, body, prompt)

    async def _schedule(self, offsets: Sequence[float]) -> None:
        cap = asyncio.Semaphore(self.plan.concurrency) if self.plan.concurrency else None
        for index in range(min(self.n, len(offsets))):
            send_at = self.t0 + offsets[index]
            if send_at >= self.deadline:
                break
            body, prompt = self._build(index)
            delay = send_at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if cap is not None:
                await cap.acquire()
                if time.perf_counter() >= self.deadline:  # waited for a slot past the end
                    cap.release()
                    break
            self._spawn(self._capped(cap, self._one(index, offsets[index], body, prompt)))

    @staticmethod
    async def _capped(cap: asyncio.Semaphore | None, coro: Any) -> None:
        try:
            await coro
        finally:
            if cap is not None:
                cap.release()

    @staticmethod
    def build(endpoint: Endpoint, plan: LoadPlan, index: int) -> tuple[bytes, Prompt]:
        prompt = plan.prompt(index)
        return request_body(endpoint, prompt), prompt

    def _build(self, index: int) -> tuple[bytes, Prompt]:
        return self.build(self.endpoint, self.plan, index)

    async def _one(self, index: int, scheduled: float | None, body: bytes, prompt: Prompt) -> None:
        record = RequestRecord(
            index=index,
            start_s=time.perf_counter() - self.t0,
            scheduled_s=scheduled,
            input_tokens=prompt.input_tokens,
            max_tokens=prompt.max_tokens,
        )
        self.records.append(record)
        await send_request(self.session, self.endpoint, body, record)
        self.bar.update(record)
