"""The FakeBackend itself: deterministic, honours max_tokens and stop ids, records aborts."""

from __future__ import annotations

import asyncio

import pytest

from interlock.errors import EngineError, NoWorkers
from interlock.frontend.backend import ModelEntry, RequestContext
from interlock.frontend.fake import FakeBackend, FakeScript
from interlock.protocol import GenerateOutput, GenerateRequest, SamplingParams

ENTRY = ModelEntry("m", "/x", 128)


def request(max_tokens: int = 4, seed: int | None = None, **sampling: object) -> GenerateRequest:
    return GenerateRequest(
        request_id=f"r{max_tokens}{seed}",
        token_ids=(1, 2, 3),
        sampling=SamplingParams(max_tokens=max_tokens, seed=seed, **sampling),  # type: ignore[arg-type]
    )


def collect(backend: FakeBackend, req: GenerateRequest) -> list[GenerateOutput]:
    async def run() -> list[GenerateOutput]:
        return [out async for out in backend.generate(req, RequestContext(req.request_id, "chat"))]

    return asyncio.run(run())


def tokens(outs: list[GenerateOutput]) -> list[int]:
    return [t for o in outs for t in o.token_ids]


def test_deterministic_per_prompt_and_seed() -> None:
    backend = FakeBackend([ENTRY])
    a, b, c = (collect(backend, request(seed=s)) for s in (1, 1, 2))
    assert tokens(a) == tokens(b) != tokens(c)
    assert [o.finish_reason for o in a] == [None, None, None, "length"]
    assert backend.finished == [o[0].request_id for o in (a, b, c)]


def test_script_tokens_stop_ids_and_chunks() -> None:
    backend = FakeBackend(
        [ENTRY], FakeScript(token_ids=(5, 6, 7, 8, 9), tokens_per_output=2, cached_tokens=2)
    )
    outs = collect(backend, request(max_tokens=10, stop_token_ids=(7,)))
    assert [o.token_ids for o in outs] == [(5, 6), (7,)]
    assert outs[-1].finish_reason == "stop" and outs[-1].num_cached_tokens == 2


def test_failures_before_and_after_first_token() -> None:
    with pytest.raises(NoWorkers):
        collect(FakeBackend([ENTRY], FakeScript(error=NoWorkers("none"))), request())
    backend = FakeBackend([ENTRY], FakeScript(error=EngineError("boom"), error_after=2))
    with pytest.raises(EngineError):
        collect(backend, request())
    assert backend.aborted == ["r4None"]


def test_closing_early_records_an_abort() -> None:
    backend = FakeBackend([ENTRY])

    async def run() -> None:
        stream = backend.generate(request(), RequestContext("r", "chat"))
        await anext(stream)
        await stream.aclose()

    asyncio.run(run())
    assert backend.aborted == ["r4None"] and backend.active == 0
