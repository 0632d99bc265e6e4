from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from interlock.engine.async_engine import AsyncEngine
from interlock.engine.clock import RealClock
from interlock.engine.core import EngineCore
from interlock.engine.runners.mock import MockRunner, reference_output
from interlock.engine.timing import TimingModel
from interlock.protocol import BlockStored, GenerateOutput, KVEvent, LoadReport
from tests.engine.conftest import VOCAB, make_config, request, tokens

T = TypeVar("T")
PROMPT = list(range(40, 57))


def _engine(sink: object | None = None) -> AsyncEngine:
    # Real clock, modelled times sped up 1000x: steps take ~20-50 us of sleep.
    runner = MockRunner(
        num_blocks=64, block_size=4, vocab_size=VOCAB, timing=TimingModel(speedup=1000), clock=RealClock()
    )
    return AsyncEngine(EngineCore(make_config(), runner), sink=sink)  # type: ignore[arg-type]


def _run(test: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(asyncio.wait_for(test(), timeout=20))


async def _collect(engine: AsyncEngine, rid: str, prompt: list[int], n: int) -> list[GenerateOutput]:
    return [o async for o in engine.generate(request(rid, prompt, n))]


async def _wait_idle(engine: AsyncEngine) -> None:
    for _ in range(200):
        if not await engine.call(lambda c: c.has_unfinished()):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("engine never became idle")


def test_streams_concurrent_requests() -> None:
    async def body() -> None:
        engine = _engine()
        prompts = {f"r{i}": [i + 1] * (3 + i) for i in range(6)}
        results = await asyncio.gather(*(_collect(engine, rid, p, 10) for rid, p in prompts.items()))
        for (rid, p), outs in zip(prompts.items(), results, strict=True):
            assert tokens(outs) == reference_output(p, 10, vocab_size=VOCAB)
            assert outs[-1].finish_reason == "length" and all(o.request_id == rid for o in outs)
        await engine.shutdown()

    _run(body)


def test_closing_the_stream_aborts_and_frees_blocks() -> None:
    async def body() -> None:
        engine = _engine()
        agen = engine.generate(request("a", PROMPT, 100))
        first = await agen.__anext__()
        assert first.token_ids
        await agen.aclose()
        await _wait_idle(engine)
        assert await engine.call(lambda c: c.pool.num_used_blocks) == 0
        await engine.call(lambda c: c.check_integrity())
        await engine.shutdown()

    _run(body)


def test_cancelled_consumer_aborts() -> None:
    async def body() -> None:
        engine = _engine()
        started = asyncio.Event()

        async def consume() -> None:
            async for _ in engine.generate(request("a", PROMPT, 100)):
                started.set()

        task = asyncio.create_task(consume())
        await started.wait()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await _wait_idle(engine)
        assert await engine.call(lambda c: c.pool.num_used_blocks) == 0
        await engine.shutdown()

    _run(body)


def test_bad_request_errors_and_the_loop_goes_on() -> None:
    async def body() -> None:
        engine = _engine()
        bad, good = await asyncio.gather(
            _collect(engine, "bad", [VOCAB + 1], 4), _collect(engine, "good", PROMPT, 4)
        )
        assert bad[-1].finish_reason == "error" and bad[-1].error is not None
        assert bad[-1].error.code == "invalid_request"
        assert tokens(good) == reference_output(PROMPT, 4, vocab_size=VOCAB)
        # A stream id already in flight is refused without touching the first one.
        agen = engine.generate(request("x", PROMPT, 50))
        await agen.__anext__()
        dup = await _collect(engine, "x", PROMPT, 4)
        assert dup[-1].error is not None and dup[-1].error.code == "invalid_request"
        await agen.aclose()
        await engine.shutdown()

    _run(body)


class RecordingSink:
    def __init__(self) -> None:
        self.events: list[KVEvent] = []
        self.loads: list[LoadReport] = []
        self.loop: asyncio.AbstractEventLoop | None = None

    def on_kv_events(self, events: list[KVEvent]) -> None:
        self.loop = asyncio.get_running_loop()  # called on the engine's event loop
        self.events += events

    def on_load(self, load: LoadReport) -> None:
        self.loads.append(load)


def test_sink_gets_events_and_load_and_loop_idles() -> None:
    async def body() -> None:
        sink = RecordingSink()
        engine = _engine(sink)
        await _collect(engine, "a", PROMPT, 8)
        await _wait_idle(engine)
        await asyncio.sleep(0.02)  # let the last sink calls run
        assert sink.loop is asyncio.get_running_loop()
        assert [e for e in sink.events if isinstance(e, BlockStored)]
        assert sink.loads and sink.loads[-1] == engine.load()
        steps = engine.core.runner.steps  # type: ignore[attr-defined]
        await asyncio.sleep(0.05)
        assert engine.core.runner.steps == steps  # type: ignore[attr-defined]
        await engine.shutdown()

    _run(body)


def test_shutdown_ends_open_streams() -> None:
    async def body() -> None:
        engine = _engine()
        agen = engine.generate(request("a", PROMPT, 200))
        await agen.__anext__()
        await engine.shutdown()
        rest = [o async for o in agen]
        assert rest[-1].finish_reason == "abort" and rest[-1].error is not None
        late = await _collect(engine, "b", PROMPT, 4)
        assert late[-1].error is not None and late[-1].error.code == "service_unavailable"

    _run(body)


def test_remote_prefill_through_call() -> None:
    async def body() -> None:
        from interlock.protocol import GenerateRequest, KVTransferParams, SamplingParams

        prefill, decode = _engine(), _engine()
        sp = SamplingParams(max_tokens=6, ignore_eos=True)
        req = GenerateRequest(
            request_id="p",
            token_ids=tuple(PROMPT),
            sampling=sp,
            kv_transfer=KVTransferParams(do_remote_decode=True),
        )
        outs = [o async for o in prefill.generate(req)]
        kt = outs[-1].kv_transfer
        assert kt is not None
        _, data = await prefill.call(lambda c: c.export_request_kv("p"))
        await prefill.call(lambda c: c.release_request_kv("p"))
        dreq = GenerateRequest(request_id="d", token_ids=tuple(PROMPT), sampling=sp, kv_transfer=kt)
        agen = decode.generate(dreq)
        first = asyncio.ensure_future(agen.__anext__())
        await asyncio.sleep(0)  # let the generator submit the request before the KV
        assert await decode.call(lambda c: c.finish_remote_kv("d", data))
        got = [await first] + [o async for o in agen]
        assert tokens(got) == reference_output(PROMPT, 6, vocab_size=VOCAB)
        await prefill.shutdown()
        await decode.shutdown()

    _run(body)
