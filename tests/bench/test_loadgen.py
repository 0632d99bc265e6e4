"""Pacing and bounds of the load generator, against the fake server.

Throughput tolerance -25%/+5% (a loaded machine only slows the loop down): in a closed loop each of C workers finishes a request every
ttft + (N - 1) * itl plus a few ms of loopback overhead per request.
"""

from __future__ import annotations

from interlock.bench.client import Endpoint
from interlock.bench.fake_server import FakeOpenAIServer, FakeTiming
from interlock.bench.lengths import LengthDist
from interlock.bench.loadgen import Bounds, RunResult, run_load
from interlock.bench.plans import concurrency_plan, rate_plan
from interlock.bench.prompts import SyntheticSpec
from interlock.bench.stats import summarize
from interlock.bench.vocab import WordVocab

from .conftest import with_server

SPEC = SyntheticSpec(LengthDist.parse("32"), LengthDist.parse("10"))


def test_closed_loop_throughput_matches_injected() -> None:
    ttft, itl, n, c = 0.05, 0.01, 10, 4

    async def body(server: FakeOpenAIServer) -> RunResult:
        plan = concurrency_plan(SPEC, WordVocab(), c, 24)
        return await run_load(Endpoint(server.url, "fake-model"), plan, Bounds(24, 30.0))

    run = with_server(FakeTiming(ttft_s=ttft, itl_s=itl), body)
    s = summarize(run.records, run.duration_s)
    assert s.ok == s.requests == 24 and s.errors == {}
    expected = c * n / (ttft + (n - 1) * itl)  # tokens per second
    assert 0.75 * expected <= s.output_throughput <= 1.05 * expected
    assert -2 <= s.ttft_ms.p50 - 50 <= 30 and abs(s.itl_ms.p50 - 10) <= 1.5
    assert [r.index for r in run.records] == list(range(24))


def test_constant_rate_sends_on_schedule() -> None:
    async def body(server: FakeOpenAIServer) -> tuple[RunResult, list[float]]:
        plan = rate_plan(SPEC, WordVocab(), 10.0, 10, "constant")
        run = await run_load(Endpoint(server.url, "fake-model"), plan, Bounds(10, 30.0))
        return run, [r.t for r in server.received]

    run, arrivals = with_server(FakeTiming(ttft_s=0.01, itl_s=0.001), body)
    # The schedule is exact; a send is never early, and late only by a stall of a busy machine's
    # event loop (tens of ms beside the suite's other worker), which does not carry over to the
    # next: all at once would be up to 0.9 s off, a drifting clock late by more each time.
    scheduled = sorted(r.scheduled_s for r in run.records if r.scheduled_s is not None)
    assert len(scheduled) == 10
    assert all(abs((s - scheduled[0]) - k * 0.1) < 1e-6 for k, s in enumerate(scheduled))
    for k, t in enumerate(arrivals):
        assert abs((t - arrivals[0]) - k * 0.1) <= 0.25
    for r in run.records:
        assert r.scheduled_s is not None and 0 <= r.start_s - r.scheduled_s <= 0.25


def test_duration_bound_stops_sending_and_cancels_after_grace() -> None:
    async def body(server: FakeOpenAIServer) -> RunResult:
        plan = concurrency_plan(
            SyntheticSpec(LengthDist.parse("8"), LengthDist.parse("1000")), WordVocab(), 2, 50
        )
        return await run_load(
            Endpoint(server.url, "fake-model"), plan, Bounds(50, duration_s=0.3, grace_s=0.2)
        )

    run = with_server(FakeTiming(ttft_s=0.01, itl_s=0.01), body)  # each request would take 10 s
    assert len(run.records) == 2
    assert {r.error for r in run.records} == {"cancelled"}
    assert run.duration_s < 1.0


def test_request_count_bound() -> None:
    async def body(server: FakeOpenAIServer) -> RunResult:
        plan = rate_plan(SPEC, WordVocab(), 1000.0, 100)
        return await run_load(Endpoint(server.url, "fake-model"), plan, Bounds(7, 30.0))

    run = with_server(FakeTiming(ttft_s=0.0, itl_s=0.0), body)
    assert len(run.records) == 7 and all(r.ok for r in run.records)


def test_capped_open_loop_never_exceeds_the_cap() -> None:
    async def body(server: FakeOpenAIServer) -> RunResult:
        plan = rate_plan(SPEC, WordVocab(), 1000.0, 12, "constant", max_concurrency=2)
        return await run_load(Endpoint(server.url, "fake-model"), plan, Bounds(12, 30.0))

    run = with_server(FakeTiming(ttft_s=0.02, itl_s=0.002), body)
    assert len(run.records) == 12 and all(r.ok for r in run.records)
    spans = [(r.start_s, r.start_s + (r.e2e_s or 0.0)) for r in run.records]
    assert max(sum(s <= t < e for s, e in spans) for t, _ in spans) <= 2
