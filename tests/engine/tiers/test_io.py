"""The tier I/O thread: jobs in order, errors kept, a wake-up after each; and the async engine
woken by it."""

from __future__ import annotations

import asyncio
import threading

from interlock.engine.async_engine import AsyncEngine
from interlock.engine.runners.mock import reference_output
from interlock.engine.tiers import ThreadIO
from tests.engine.conftest import VOCAB, request
from tests.engine.tiers.test_engine_tiers import prompt, tiered_engine


def test_jobs_run_in_order_errors_are_kept_and_each_end_wakes() -> None:
    io = ThreadIO()
    woken = threading.Semaphore(0)
    io.on_done = woken.release
    order: list[int] = []
    jobs = [io.submit(lambda i=i: order.append(i)) for i in range(5)]
    bad = io.submit(lambda: 1 // 0)
    assert bad.wait(10) and all(j.wait(10) for j in jobs)
    assert order == [0, 1, 2, 3, 4] and isinstance(bad.error, ZeroDivisionError)
    assert all(woken.acquire(timeout=10) for _ in range(6))
    io.close()
    late = io.submit(lambda: 7)  # after close: run inline
    assert late.done and late.result == 7


def test_the_async_engine_serves_a_prefix_back_from_the_host_tier() -> None:
    async def main() -> None:
        core = tiered_engine(ThreadIO())  # type: ignore[arg-type]
        engine = AsyncEngine(core)
        a = prompt(1)

        async def run(rid: str, p: list[int]) -> tuple[list[int], int]:
            toks: list[int] = []
            cached = 0
            async for out in engine.generate(request(rid, p, 3)):
                toks += out.token_ids
                cached = out.num_cached_tokens
            return toks, cached

        first, _ = await run("a1", a)
        for i in range(3):
            await run(f"x{i}", prompt(10 + i))
        again, cached = await asyncio.wait_for(run("a2", a), 30)
        assert first == again == reference_output(a, 3, vocab_size=VOCAB) and cached == 20
        assert {s.tier: s.loads for s in core.load.kv_tiers}["host"] > 0
        await engine.shutdown()

    asyncio.run(main())
