"""Measured timings against the fake server's injected ones.

Tolerance: the fake sends each chunk at an absolute time (arrival + offset), so a measured
TTFT should sit a little above the injected one (loopback HTTP, event-loop wake-ups). On this
shared 2-core machine (load average 5-10 from other work) we allow +50 ms / -2 ms on TTFT,
15% on the median inter-chunk gap and 25% on the per-request ITL.
"""

from __future__ import annotations

import asyncio
import statistics

import aiohttp
import pytest

from interlock.bench.client import Endpoint, RequestRecord, request_body, send_request
from interlock.bench.fake_server import FakeOpenAIServer, FakeTiming
from interlock.bench.prompts import Prompt
from interlock.bench.stats import chunk_gaps_s, request_itl_s

from .conftest import with_server

TTFT, ITL, N = 0.08, 0.02, 12
PROMPT = Prompt(text=" the of and", token_ids=(5, 6, 7), input_tokens=3, max_tokens=N)


async def _send_many(
    server: FakeOpenAIServer, endpoint: Endpoint, count: int, prompt: Prompt = PROMPT
) -> list[RequestRecord]:
    async with aiohttp.ClientSession() as session:
        records = [RequestRecord(index=i, start_s=0.0) for i in range(count)]
        await asyncio.gather(
            *(send_request(session, endpoint, request_body(endpoint, prompt), r) for r in records)
        )
        return records


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_ttft_and_itl_match_injected(api: str) -> None:
    async def body(server: FakeOpenAIServer) -> list[RequestRecord]:
        return await _send_many(server, Endpoint(server.url, "fake-model", api=api), 3)  # type: ignore[arg-type]

    for r in with_server(FakeTiming(ttft_s=TTFT, itl_s=ITL), body):
        assert r.ok, r.error_detail
        # The role chunk is not counted (a TTFT under the injected one); the top is loose: a
        # loaded machine (the whole suite on two cores) delayed a first token by 68 ms.
        assert r.ttft_s is not None and TTFT - 0.002 <= r.ttft_s <= TTFT + 0.5
        assert r.output_tokens_stream == r.output_tokens_usage == N
        assert r.prompt_tokens_usage == 3 and r.cached_tokens_usage == 0
        gaps = chunk_gaps_s(r)
        assert len(gaps) == N - 1 and abs(statistics.median(gaps) - ITL) <= 0.15 * ITL
        # The fake sends at absolute times, so one late first chunk shortens the rest of the
        # stream as seen by the client: the per-request mean gets a looser bound.
        itl = request_itl_s(r)
        assert itl is not None and abs(itl - ITL) <= 0.25 * ITL


def test_multi_token_chunks_are_counted_by_usage() -> None:
    async def body(server: FakeOpenAIServer) -> list[RequestRecord]:
        return await _send_many(server, Endpoint(server.url, "fake-model"), 1)

    (r,) = with_server(FakeTiming(ttft_s=0.02, itl_s=0.01, tokens_per_chunk=3), body)
    assert r.output_tokens_stream == 4 and r.output_tokens_usage == N and r.output_tokens == N
    # 4 chunks of 3 tokens; the last token lands (N - 1) * itl after the first *token*, which
    # shares the first chunk, so the per-request ITL is (N - 3) * itl / (N - 1).
    itl = request_itl_s(r)
    assert itl is not None and abs(itl - 0.01 * (N - 3) / (N - 1)) <= 0.5 * 0.01 * (N - 3) / (N - 1)


def test_token_ids_are_sent_as_the_completions_prompt() -> None:
    async def body(server: FakeOpenAIServer) -> object:
        await _send_many(server, Endpoint(server.url, "m", api="completions", send_token_ids=True), 1)
        return server.received[0].body

    sent = with_server(FakeTiming(ttft_s=0.0, itl_s=0.0), body)
    assert sent["prompt"] == [5, 6, 7] and sent["stream_options"] == {"include_usage": True}  # type: ignore[index]
    assert sent["ignore_eos"] is True and sent["max_tokens"] == N  # type: ignore[index]


def test_errors_are_counted_by_kind() -> None:
    timing = FakeTiming(
        ttft_s=0.0, itl_s=0.001, fail_every=((5, 500), (2, 503)), stream_error_every=3, drop_every=7
    )

    async def body(server: FakeOpenAIServer) -> list[str | None]:
        out = []
        async with aiohttp.ClientSession() as session:
            endpoint = Endpoint(server.url, "fake-model")
            for i in range(10):  # sequential: the k-th arrival is request k
                r = await send_request(
                    session, endpoint, request_body(endpoint, PROMPT), RequestRecord(i, 0.0)
                )
                out.append(r.error)
        return out

    errors = with_server(timing, body)
    # arrivals 1..10: 2,4,8 -> 503; 5,10 -> 500; 3,9 -> stream error; 6 -> 503 (fail wins); 7 -> dropped
    assert errors == [
        None,
        "http_503",
        "stream_error",
        "http_503",
        "http_500",
        "http_503",
        "disconnected",
        "http_503",
        "stream_error",
        "http_500",
    ]


def test_connect_error_is_recorded() -> None:
    async def go() -> RequestRecord:
        async with aiohttp.ClientSession() as session:
            endpoint = Endpoint("http://127.0.0.1:9", "m")  # discard port: nothing listens
            return await send_request(
                session, endpoint, request_body(endpoint, PROMPT), RequestRecord(0, 0.0)
            )

    r = asyncio.run(go())
    assert r.error == "connect_error" and not r.ok
