"""The engine seam: a worker serves any ``ServingEngine`` (here the in-package fake) on the
planes, and the router above it routes, caches and fails over without knowing which engine runs."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import pytest

from interlock.engine.serving import FakeEngine, NullKVEventSink
from interlock.engine.worker import Worker, WorkerOptions
from interlock.protocol import BlockRemoved, GenerateRequest, InstanceInfo, KVEvent, SamplingParams, subjects
from interlock.protocol.routing import RequestContext
from interlock.router.dispatcher import EXPLAIN_HEADER
from interlock.router.model_router import RouterConfig
from interlock.router.service import RouterService
from interlock.runtime import InProcRegistry, connect_runtime

BLOCK = 16
PROMPT = tuple(range(1000, 1100))  # six full blocks


def worker(wid: str, engine: FakeEngine, runtime) -> Worker:  # type: ignore[no-untyped-def]
    info = InstanceInfo(
        instance_id=wid,
        endpoint=subjects.GENERATE_ENDPOINT,
        model="m",
        block_size=engine.block_size,
        kv_blocks_total=engine.kv_blocks_total,
    )
    return Worker(
        engine,
        info,
        discovery=runtime.discovery,
        requests=runtime.requests,
        events=runtime.events,
        options=WorkerOptions(health_interval_s=0.02),
    )


async def ask(
    service: RouterService, rid: str, prompt: tuple[int, ...], n: int = 4
) -> tuple[list[int], str, int]:
    req = GenerateRequest(request_id=rid, token_ids=prompt, model="m", sampling=SamplingParams(max_tokens=n))
    ctx = RequestContext(request_id=rid, endpoint="completions", explain=True)
    tokens, cached = [], 0
    async with asyncio.timeout(10):
        async for out in service.generate(req, ctx):
            tokens += out.token_ids
            cached = out.num_cached_tokens
    return tokens, ctx.response_headers[EXPLAIN_HEADER].split(";")[0].split("=")[-1], cached


@pytest.mark.timeout(60)
def test_the_router_routes_to_the_fake_engine_that_holds_the_prefix_and_survives_its_death() -> None:
    async def main() -> None:
        registry = InProcRegistry()
        rt = await connect_runtime(None, registry=registry)
        service = RouterService(
            discovery=rt.discovery,
            requests=rt.requests,
            events=rt.events,
            config=RouterConfig(block_size=BLOCK),
        )
        await service.start()
        engines = {"a": FakeEngine(block_size=BLOCK), "b": FakeEngine(block_size=BLOCK)}
        workers = {}
        try:
            for wid, engine in engines.items():
                wrt = await connect_runtime(None, registry=registry)
                workers[wid] = (worker(wid, engine, wrt), wrt)
                await workers[wid][0].start()
            assert await service.wait_for_workers(2, 5.0) == 2
            assert service.instance("a").metadata["engine"] == "fake"

            tokens, first, cached = await ask(service, "r0", PROMPT)
            assert tokens == [1100, 1101, 1102, 1103] and cached == 0
            # The KV events of the first request reach the router: the same prefix goes back.
            for i in range(4):
                _, where, cached = await ask(service, f"r{i + 1}", (*PROMPT, 7 + i))
                assert where == first and cached == 96

            # A dead engine under a live worker: the worker leaves and says why; requests go on.
            engines[first].kill("engine core process died")
            async with asyncio.timeout(5):
                await workers[first][0].dead.wait()
                while service.instance(first) is not None:
                    await asyncio.sleep(0.01)
            assert workers[first][0].problem == "engine core process died"
            _, where, _ = await ask(service, "after", PROMPT)
            assert where != first
        finally:
            for w, wrt in workers.values():
                with contextlib.suppress(Exception):
                    await w.close()
                await wrt.close()
            await service.close()
            await rt.close()

    asyncio.run(main())


class _Sink(NullKVEventSink):
    """Keeps the KV events."""

    def __init__(self) -> None:
        self.events: list[KVEvent] = []

    def on_kv_events(self, events: list[KVEvent]) -> None:
        self.events.extend(events)


async def _serve(
    engine: FakeEngine, tokens: tuple[int, ...], tokens_out: int, during: Callable[[], None] | None = None
) -> None:
    req = GenerateRequest(
        request_id=f"r{tokens[0]}", token_ids=tokens, sampling=SamplingParams(max_tokens=tokens_out)
    )
    async for _ in engine.generate(req):
        if during is not None:
            during()


def test_the_fake_engine_reports_running_blocks_as_used_and_evicts_the_least_recent_cached_ones() -> None:
    """An idle fake engine is not full: only running requests' blocks are in use; its cache holds
    ``num_blocks`` and announces what it evicts, a request's last block before its first."""
    engine = FakeEngine(block_size=4, num_blocks=6, step_s=0.0)
    sink = _Sink()
    engine.start(sink)
    seen: list[int] = []

    async def run() -> None:
        first = tuple(range(100, 108))  # two blocks
        await _serve(engine, first, 2, during=lambda: seen.append(engine.load().kv_blocks_used))
        assert seen and set(seen) == {2}
        assert engine.load().kv_blocks_used == 0  # finished: cached, not in use
        for start in (200, 300):
            await _serve(engine, tuple(range(start, start + 8)), 1)
        assert not [e for e in sink.events if isinstance(e, BlockRemoved)]  # six blocks fit
        await _serve(engine, first, 1)  # a hit: now the most recent
        await _serve(engine, tuple(range(400, 408)), 1)  # two more: the 200 prompt goes
        removed = [h for e in sink.events if isinstance(e, BlockRemoved) for h in e.block_hashes]
        cached = await engine.kv_state()
        assert len(removed) == 2 and len(cached["device"]) == 6
        assert not set(removed) & set(cached["device"])
        stored_200 = [e for e in sink.events if getattr(e, "parent_block_hash", 0) is None][1]
        assert removed[1] == stored_200.block_hashes[0]  # the child went first, then its parent

    asyncio.run(run())


@pytest.mark.timeout(60)
def test_a_busy_worker_paces_its_load_reports_and_sends_its_idle_state_within_the_interval() -> None:
    """Requests ending 30 ms apart make a report each; the routers get one per interval, each
    held one marked with its age, and the last (nothing running) by the interval's end, long
    before the idle report would come."""

    async def main() -> None:
        import msgspec

        from interlock.protocol import LoadReport

        registry = InProcRegistry()
        rt = await connect_runtime(None, registry=registry)
        sub = await rt.events.subscribe(subjects.load("w"))
        engine = FakeEngine(block_size=BLOCK, step_s=0.03)
        info = InstanceInfo(
            instance_id="w",
            endpoint=subjects.GENERATE_ENDPOINT,
            model="m",
            block_size=BLOCK,
            kv_blocks_total=1024,
        )
        wrt = await connect_runtime(None, registry=registry)
        w = Worker(
            engine, info, discovery=wrt.discovery, requests=wrt.requests, events=wrt.events,
            options=WorkerOptions(load_interval_s=0.2, idle_report_s=30.0),
        )  # fmt: skip
        await w.start()
        got: list[tuple[float, LoadReport]] = []

        async def listen() -> None:
            async for _, payload in sub:
                got.append(
                    (asyncio.get_running_loop().time(), msgspec.msgpack.decode(payload, type=LoadReport))
                )

        listener = asyncio.create_task(listen())
        try:
            loop = asyncio.get_running_loop()
            reqs = [_serve(engine, (2000 + 100 * i, *range(50)), 1 + i) for i in range(6)]
            await asyncio.gather(*reqs)  # they end 30 ms apart: six reports made in 150 ms
            ended = loop.time()
            await asyncio.sleep(0.5)
            times = [t for t, _ in got]
            assert all(b - a >= 0.2 - 0.01 for a, b in zip(times, times[1:], strict=False)), times
            assert len(got) < 6 and any(r.held_s > 0 for _, r in got)
            last_t, last = got[-1]
            assert last.num_running == 0 and last_t - ended <= 0.2 + 0.1
        finally:
            listener.cancel()
            await w.close()
            await wrt.close()
            await rt.close()

    asyncio.run(main())
