"""The traffic of ``fleet_scale.py``: an open-loop load of completions over cached prefixes,
and the probes that ask the router where a prefix goes (convergence, KV lag).

A probe's prompt ends in ``PROBE_TOKEN``: the synthetic engine serves it without storing it, so
probing never changes which worker holds a prefix.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable

from fleet_measure import Frontend, PhaseResult, Reply
from fleet_workers import PROBE_TOKEN, VOCAB, ChainShape, chain_tokens, worker_id

LAG_BLOCKS = 4
"""Blocks of a prefix stored to measure KV lag (and of a link-cut canary)."""


class Load:
    """Open-loop arrivals while ``gate`` is set (arrivals while it is clear are not sent)."""

    def __init__(
        self, fe: Frontend, shape: ChainShape, workers: int, rate: float, max_tokens: int, seed: int
    ):
        self.fe = fe
        self.shape = shape
        self.workers = workers
        self.rate = rate
        self.max_tokens = max_tokens
        self.rng = random.Random(seed)
        self.gate = asyncio.Event()
        self.phase: PhaseResult | None = None
        self.in_flight: set[asyncio.Task[None]] = set()

    def prompt(self) -> tuple[list[int], str]:
        rng, shape = self.rng, self.shape
        w = rng.randrange(self.workers)
        c = rng.randrange(1, shape.num_chains) if shape.num_chains > 1 else 0
        depth = rng.randint(min(shape.shared_blocks + 1, shape.lengths[c]), shape.lengths[c])
        head = chain_tokens(shape, w, c)[: depth * shape.block_size]
        tail = [rng.randrange(1, VOCAB - 1) for _ in range(rng.randint(8, 40))]
        return head + tail, worker_id(w)

    async def run(self) -> None:
        next_at = time.monotonic()
        while True:
            next_at += self.rng.expovariate(self.rate)
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            if self.gate.is_set() and self.phase is not None:
                task = asyncio.create_task(self._one(self.phase))
                self.in_flight.add(task)
                task.add_done_callback(self.in_flight.discard)

    async def _one(self, phase: PhaseResult) -> None:
        prompt, holder = self.prompt()
        reply = await self.fe.complete(prompt, self.max_tokens)
        if reply.ok:
            phase.ok += 1
            phase.latencies_ms.append(reply.latency_s * 1e3)
            phase.to_holder += reply.worker == holder
        else:
            phase.failed += 1
            if len(phase.errors) < 5:
                phase.errors.append(reply.error)

    async def hold(self, timeout_s: float = 30.0) -> None:
        """Stop sending and let what is in flight finish."""
        self.gate.clear()
        if self.in_flight:
            await asyncio.wait(list(self.in_flight), timeout=timeout_s)


async def routed_to(fe: Frontend, prompt: list[int], worker: str, overlap: int) -> Reply | None:
    """Probe ``prompt`` (never stored); the reply if the router sent it to ``worker`` with
    ``overlap`` blocks matched, else None."""
    reply = await fe.complete([*prompt, PROBE_TOKEN], 1)
    return reply if reply.ok and reply.worker == worker and reply.overlap == overlap else None


async def converge(
    fe: Frontend,
    targets: dict[str, tuple[list[int], int]],
    deadline: float,
    concurrency: int = 8,
    applied: Callable[[], Awaitable[bool]] | None = None,
) -> float | None:
    """Probe every target until each is routed to its holder; the monotonic time the last one
    was (None: not by ``deadline``; a probe sent before it may still take its reply timeout).

    ``applied`` (the frontend's metrics say every state is applied) is polled first, every
    0.25 s, and the probing starts only then, two at a time: rounds of probes at
    ``concurrency`` from the frontend's start would load it many times more than the traffic
    whose latency the phase measures. If the first round routes every target to its holder,
    the index was complete when the metrics said so, and that is the time returned; else the
    time of the round that completes it."""
    pending = dict(targets)
    gate = asyncio.Semaphore(concurrency)
    said: float | None = None
    if applied is not None:
        while not await applied():
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(0.25)
        said = time.monotonic()
        gate = asyncio.Semaphore(min(concurrency, 2))  # a check now: gently, the load goes on

    async def probe(wid: str) -> None:
        async with gate:
            if time.monotonic() > deadline:
                return
            prompt, overlap = pending[wid]
            if await routed_to(fe, prompt, wid, overlap) is not None:
                del pending[wid]

    rounds = 0
    while pending:
        if time.monotonic() > deadline:
            return None
        await asyncio.gather(*(probe(wid) for wid in list(pending)))
        rounds += 1
        if pending:
            await asyncio.sleep(0.05)
    return said if said is not None and rounds == 1 else time.monotonic()


async def store_fresh(
    fe: Frontend, worker: str, rng: random.Random, blocks: int, block_size: int = 16
) -> tuple[list[int], Reply]:
    """Store a new prefix of ``blocks`` blocks on ``worker`` (a pinned request)."""
    prefix = [rng.randrange(1, VOCAB - 1) for _ in range(blocks * block_size)]
    return prefix, await fe.complete([*prefix, 1], 1, pin=worker)


async def kv_lag(fe: Frontend, worker: str, rng: random.Random, timeout_s: float) -> float | None:
    """Seconds from storing a new prefix on ``worker`` until the router sends it there (None:
    the store failed, or the router did not send it there within ``timeout_s``)."""
    prefix, stored = await store_fresh(fe, worker, rng, LAG_BLOCKS)
    if not stored.ok:
        return None
    while time.monotonic() - stored.done < timeout_s:
        hit = await routed_to(fe, prefix, worker, LAG_BLOCKS)
        if hit is not None:
            return hit.done - stored.done
    return None
