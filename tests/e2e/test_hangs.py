"""Chaos that does not crash: hangs. ``interlock serve --runner mock`` keeps serving through them.

* serve's nats-server SIGSTOPped for 15 s under load (sockets open, nothing answers; with the
  default 5 s leases): no request fails, no stream breaks or migrates, new requests are served
  throughout, ``/health`` stays 200 (``degraded``, the control plane unreachable) and reads
  ``ok`` again once the server resumes.

Figures are printed (``-s``) and recorded in BENCHMARKS.md ("Reliability under hangs").
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx
import pytest

from tests.e2e.conftest import Served, children, start_serve
from tests.e2e.test_chaos import (
    SERVE_ENV,
    Result,
    assert_whole,
    check_pools,
    client,
    counter,
    instance_ids,
    stream,
    stream_loop,
    wait_for,
)

pytestmark = pytest.mark.slow

MOCK = ("--runner", "mock", "--max-model-len", "4096", "--num-blocks", "1024")
HANG_S = 15.0
LOOPS = 6
LONG = 2
"""Streams that run across the whole hang."""


def test_a_15_s_nats_hang_fails_no_request_and_breaks_no_stream() -> None:
    served = start_serve(*MOCK, "--workers", "2", timeout_s=120, env=SERVE_ENV)
    try:
        asyncio.run(_hang(served))
    finally:
        [nats] = children(served, b"nats-server") or [0]
        if nats:
            os.kill(nats, signal.SIGCONT)
        served.stop()


async def _hang(served: Served) -> None:
    assert await wait_for(lambda: len(instance_ids(served)) == 2, 10)
    [nats] = children(served, b"nats-server")
    c = client(served, timeout_s=60)
    probe = await stream(c, "how fast is the mock", 40)
    per_token_s = (probe.ended - probe.first_token_at) / 39
    long_tokens = min(4000, int((HANG_S + 8) / per_token_s))
    results: list[Result] = []
    stop = asyncio.Event()

    async def long(k: int) -> Result:
        r = Result()
        try:
            await stream(c, f"long stream {k}", long_tokens, into=r)
        except Exception as exc:  # noqa: BLE001 - asserted below
            r.error = f"{type(exc).__name__}: {exc}"
        return r

    health: list[tuple[float, int, dict[str, object]]] = []

    async def watch_health() -> None:
        async with httpx.AsyncClient(base_url=served.url, timeout=10) as http:
            while not stop.is_set():
                r = await http.get("/health")
                health.append((time.monotonic(), r.status_code, r.json()))
                await asyncio.sleep(0.5)

    before = {name: counter(served, name) for name in _COUNTERS}
    longs = [asyncio.create_task(long(k)) for k in range(LONG)]
    loops = [asyncio.create_task(stream_loop(c, k, 40, results, stop)) for k in range(LOOPS)]
    watcher = asyncio.create_task(watch_health())
    await asyncio.sleep(2.0)
    os.kill(nats, signal.SIGSTOP)
    stopped_at = time.monotonic()
    await asyncio.sleep(HANG_S)
    os.kill(nats, signal.SIGCONT)
    resumed_at = time.monotonic()
    await asyncio.sleep(4.0)
    stop.set()
    await asyncio.gather(*loops, watcher)
    long_results = await asyncio.gather(*longs)
    after = {name: counter(served, name) for name in _COUNTERS}

    in_hang = [r for r in results if stopped_at < r.started and r.ended < resumed_at]
    failed = [r.error for r in results + long_results if r.error]
    statuses = sorted({code for _, code, _ in health})
    unreachable = [
        body for t, _, body in health if stopped_at < t < resumed_at and body.get("status") == "degraded"
    ]
    print(
        f"{len(results)} requests ({len(in_hang)} begun and ended within the {HANG_S:g} s hang), "
        f"{len(long_results)} streams of {long_tokens} tokens across it, {len(failed)} failed; "
        f"/health statuses {statuses}, degraded in {len(unreachable)} of the polls in the hang; "
        f"counters {_delta(before, after)}"
    )
    assert not failed, failed[:5]
    for r in long_results:
        assert_whole(r, long_tokens)
        assert r.started < stopped_at and r.ended > resumed_at
    assert in_hang, "no request was served during the hang"
    assert statuses == [200]
    assert unreachable and all(
        b["control_plane"]["state"] == "unreachable"  # type: ignore[index]
        for b in unreachable
        if "control plane" in " ".join(b["degraded"])  # type: ignore[arg-type]
    )
    assert _delta(before, after) == dict.fromkeys(_COUNTERS, 0.0)
    assert await wait_for(lambda: httpx.get(served.url + "/health", timeout=5).json()["status"] == "ok", 10)
    await check_pools(served, expected=2)


_COUNTERS = (
    "interlock_router_migrations_total",
    "interlock_router_retries_total",
    "interlock_router_stalls_total",
)


def _delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in before}
