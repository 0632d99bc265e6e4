"""Chaos under load: ``interlock serve --runner mock`` keeps every stream whole while its processes die.

* workers SIGKILLed one after another while 1,000 streams run: none fails, none loses a token;
* a worker SIGSTOPped mid-stream: its stream moves on within the stall timeout; after SIGCONT
  the worker serves again;
* the nats-server SIGKILLed (serve's own, which serve restarts; or an external one the test
  restarts): streams already running never notice, new ones are served again within 5 s.

Token counts come from ``logprobs`` (one entry per token, whatever the chunking) and from usage.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import secrets
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import pytest

from interlock.cluster.secrets import child_env
from interlock.protocol.control import ControlRequest
from interlock.protocol.subjects import GENERATE_ENDPOINT
from interlock.router.worker_control import control_call
from interlock.runtime import NatsServer, RuntimeConfig, connect_runtime
from interlock.runtime.config import NatsAuth
from tests.e2e.conftest import FAST_LEASES, Served, children, free_port, start_serve

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
MOCK = (
    "--runner",
    "mock",
    "--max-model-len",
    "1024",
    "--num-blocks",
    "512",
    "--drain-grace",
    "2",
    *FAST_LEASES,
)
AUTH = NatsAuth(user="chaos", password=secrets.token_urlsafe(16))
SECRET = secrets.token_urlsafe(32).encode()
SERVE_ENV = child_env(SECRET, AUTH)
"""serve takes this login for its nats-server and this cluster secret (as it hands its own to its
workers), so this test's own client can check pools and watch discovery."""


def runtime_config(**overrides: Any) -> RuntimeConfig:
    return RuntimeConfig(cluster_secret=SECRET, nats_auth=AUTH, **overrides)


# ---- helpers ----


def worker_pid(served: Served, instance_id: str) -> int:
    [pid] = children(served, b"worker_main\0" + instance_id.encode() + b"\0")
    return pid


def nats_url(served: Served) -> str:
    [line] = [ln for ln in served.lines if "Interlock serving" in ln]
    return re.search(r"nats (nats://\S+?)\)", line).group(1)  # type: ignore[union-attr]


def instance_ids(served: Served) -> list[str]:
    """Instance ids of serve's workers (stable across restarts), in worker order."""
    return sorted(set(re.findall(r"worker (w\d+-[0-9a-f]+) ready:", "".join(served.lines))))


def ready_count(served: Served, instance_id: str) -> int:
    return "".join(served.lines).count(f"worker {instance_id} ready:")


def counter(served: Served, name: str) -> float:
    text = httpx.get(served.url + "/metrics", timeout=10).text
    [value] = [ln.split()[-1] for ln in text.splitlines() if ln.startswith(name + " ")]
    return float(value)


async def wait_for(cond: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        await asyncio.sleep(0.1)
    return cond()


def client(served: Served, timeout_s: float = 60.0) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=served.base_url, api_key="none", max_retries=0, timeout=timeout_s)


@dataclass
class Result:
    tokens: int = 0
    usage: int = -1
    finish: str | None = None
    text: str = ""
    ids: set[str] = field(default_factory=set)
    route: str = ""
    started: float = 0.0
    first_token_at: float = 0.0
    ended: float = 0.0
    error: str = ""
    stamps: list[float] = field(default_factory=list)
    """When each chunk with tokens arrived."""

    @property
    def worker(self) -> str:
        return self.route.split("worker=", 1)[1].split(";", 1)[0]


async def stream(
    c: openai.AsyncOpenAI,
    prompt: str,
    max_tokens: int,
    *,
    headers: dict[str, str] | None = None,
    into: Result | None = None,
) -> Result:
    """One streaming completion; every token counted through its logprobs entry (``into``, when
    given, is filled as the stream goes: another task may watch it)."""
    r = into if into is not None else Result()
    r.started = time.monotonic()
    raw = await c.completions.with_raw_response.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        logprobs=0,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
        extra_headers={"x-interlock-explain": "1", **(headers or {})},
    )
    r.route = raw.headers.get("x-interlock-route", "")
    async for chunk in raw.parse():
        r.ids.add(chunk.id)
        if chunk.usage is not None:
            r.usage = chunk.usage.completion_tokens
        for choice in chunk.choices:
            assert choice.logprobs is not None and choice.logprobs.tokens is not None
            r.tokens += len(choice.logprobs.tokens)
            r.text += choice.text
            r.finish = choice.finish_reason or r.finish
            if r.tokens and not r.first_token_at:
                r.first_token_at = time.monotonic()
            r.stamps.append(time.monotonic())
    r.ended = time.monotonic()
    return r


async def stream_loop(
    c: openai.AsyncOpenAI, k: int, max_tokens: int, results: list[Result], stop: asyncio.Event
) -> None:
    """Streams one after another until ``stop``, each whole or its error kept in ``results``."""
    i = 0
    while not stop.is_set():
        r = Result()
        results.append(r)
        try:
            await stream(c, f"loop {k} request {i}", max_tokens, into=r)
            assert_whole(r, max_tokens)
        except Exception as exc:  # noqa: BLE001 - collected, asserted by the caller
            r.error = f"{type(exc).__name__}: {exc}"
            r.ended = time.monotonic()
            await asyncio.sleep(0.1)
        i += 1


def assert_whole(r: Result, max_tokens: int) -> None:
    assert (r.tokens, r.usage, r.finish, len(r.ids)) == (max_tokens, max_tokens, "length", 1)


async def check_pools(served: Served, expected: int) -> None:
    """Every live worker's block pool passes its integrity check and holds no request."""
    rt = await connect_runtime(nats_url(served), runtime_config())
    try:
        infos = await rt.discovery.instances(GENERATE_ENDPOINT)
        assert len(infos) == expected, [i.instance_id for i in infos]
        for info in infos:
            reply = await asyncio.wait_for(
                control_call(
                    rt.requests, info.metadata["control_address"], ControlRequest(op="check_integrity")
                ),
                30,
            )
            assert reply.ok and reply.integrity_error == "", (info.instance_id, reply)
            assert reply.in_flight == 0, (info.instance_id, reply)
    finally:
        await rt.close()


# ---- 1. workers SIGKILLed under load ----
REQUESTS = 1000
CONCURRENCY = 32
KILL_EVERY_S = 2.5


def test_workers_killed_under_load_lose_no_request_and_no_token() -> None:
    served = start_serve(*MOCK, "--workers", "3", "--speedup", "2", timeout_s=120, env=SERVE_ENV)
    try:
        asyncio.run(_chaos(served))
    finally:
        served.stop()


async def _chaos(served: Served) -> None:
    assert await wait_for(lambda: len(instance_ids(served)) == 3, 10)
    ids = instance_ids(served)
    rng = random.Random(1234)
    jobs = [(f"chaos {i}: {rng.random():.6f}", rng.randint(1, 200)) for i in range(REQUESTS)]
    failures: list[str] = []
    results: dict[int, Result] = {}
    done = asyncio.Event()
    kills: Counter[str] = Counter()
    killed_at: list[tuple[str, float]] = []
    c = client(served)
    sem = asyncio.Semaphore(CONCURRENCY)

    async def one(i: int) -> None:
        prompt, max_tokens = jobs[i]
        async with sem:
            try:
                results[i] = r = await stream(c, prompt, max_tokens)
                assert_whole(r, max_tokens)
            except Exception as exc:  # noqa: BLE001 - collected, asserted below
                failures.append(f"request {i} (max_tokens {max_tokens}): {type(exc).__name__}: {exc}")

    async def killer() -> None:
        """SIGKILL the workers in turn, one at a time: the next only once all are back up."""

        def all_up() -> bool:
            return all(ready_count(served, w) == kills[w] + 1 for w in ids)

        turn = 0
        while not done.is_set():
            await asyncio.sleep(KILL_EVERY_S)
            if not await wait_for(lambda: all_up() or done.is_set(), 60) or done.is_set():
                break
            victim = ids[turn % len(ids)]
            turn += 1
            os.kill(worker_pid(served, victim), signal.SIGKILL)
            kills[victim] += 1
            killed_at.append((victim, time.monotonic()))

    t0 = time.monotonic()
    chaos = asyncio.create_task(killer())
    await asyncio.gather(*(one(i) for i in range(REQUESTS)))
    took = time.monotonic() - t0
    done.set()
    await chaos
    print(f"{REQUESTS} requests in {took:.1f} s, kills {dict(kills)}")
    assert not failures, f"{len(failures)} failed:\n" + "\n".join(failures[:20])
    assert sum(kills.values()) >= 3, kills

    migrations = counter(served, "interlock_router_migrations_total")
    assert migrations > 0
    assert counter(served, "interlock_router_migrations_exhausted_total") == 0
    assert await wait_for(lambda: all(ready_count(served, w) == kills[w] + 1 for w in ids), 60), "".join(
        served.lines
    )[-3000:]
    # The streams whose worker was killed under them continued exactly where they broke: the
    # text of each is what an unbroken run of the same request gives (the mock is deterministic).
    # Taken by the client's clock, this is a superset: a busy client reads the end of a stream
    # some time after its worker sent it.
    broken = [
        i for i, r in results.items() if any(w == r.worker and r.started < t < r.ended for w, t in killed_at)
    ]
    print(
        f"migrations {migrations:.0f}; {len(broken)} streams in flight (client's clock) when their worker was killed"
    )
    assert broken
    sample = broken[:100]
    again = await asyncio.gather(*(stream(c, *jobs[i]) for i in sample))
    for i, r in zip(sample, again, strict=True):
        assert r.text == results[i].text, f"request {i} differs from an unbroken run"
    await check_pools(served, expected=3)


# ---- 2. a worker SIGSTOPped mid-stream ----
STALL_S = 2.0


@pytest.mark.parametrize("lease_s", [2.0, 30.0], ids=["lease-expires", "stall-timer"])
def test_a_stopped_worker_stream_moves_on_and_the_worker_rejoins_after_sigcont(lease_s: float) -> None:
    """With a 2 s lease the stopped worker also leaves discovery (and must come back); with a
    30 s one only the dispatcher's stall timer can notice it."""
    # speedup 0.5: about 25 ms a token, so 200 tokens last about 5 s
    served = start_serve(
        *MOCK,
        "--workers",
        "2",
        "--speedup",
        "0.5",
        "--stall-timeout",
        str(STALL_S),
        "--heartbeat-timeout",
        str(lease_s),
        timeout_s=120,
        env=SERVE_ENV,
    )
    try:
        asyncio.run(_sigstop(served, stall_detects=lease_s > STALL_S + 5))
    finally:
        for pid in children(served, b"worker"):
            os.kill(pid, signal.SIGCONT)  # a stopped worker would not drain
        served.stop()


async def _sigstop(served: Served, *, stall_detects: bool) -> None:
    assert await wait_for(lambda: len(instance_ids(served)) == 2, 10)
    c = client(served)
    r = Result()
    task = asyncio.create_task(stream(c, "stop me", 200, into=r))
    assert await wait_for(lambda: r.tokens >= 20 or task.done(), 30)
    victim = r.worker
    pid = worker_pid(served, victim)
    os.kill(pid, signal.SIGSTOP)
    stopped_at = time.monotonic()
    await task
    assert_whole(r, 200)
    gaps = [b - a for a, b in zip(r.stamps, r.stamps[1:], strict=False)]
    print(f"stopped {victim}; longest silence in the stream {max(gaps):.2f} s")
    assert STALL_S - 1.0 < max(gaps) < STALL_S + 3.0
    assert counter(served, "interlock_router_migrations_total") == 1
    if stall_detects:
        assert counter(served, "interlock_router_stalls_total") == 1

    # SIGCONT: the worker rejoins; a request pinned to it is served by it again.
    os.kill(pid, signal.SIGCONT)
    deadline = time.monotonic() + 20
    while True:
        try:
            pinned = await stream(c, "pinned", 30, headers={"x-worker-id": victim})
            break
        except openai.APIError as exc:
            assert time.monotonic() < deadline, f"pinned request still failing: {exc}"
            await asyncio.sleep(0.5)
    print(f"pinned request served {time.monotonic() - stopped_at:.2f} s after SIGSTOP")
    assert_whole(pinned, 30)
    assert pinned.worker == victim
    for i in range(3):
        again = await stream(c, f"pinned {i}", 30, headers={"x-worker-id": victim})
        assert_whole(again, 30)
        assert again.worker == victim
    await check_pools(served, expected=2)


# ---- 3. the nats-server killed and restarted under load ----
RECOVERY_S = 5.0
"""The requirement: new requests are served again within 5 s of the kill."""
REJOIN_S = 10.0
"""Both workers are in a fresh client's discovery again within this of the kill: 1.2-1.4 s on
idle cores, 5.7-6.8 s seen on 2 contended cores (a vLLM start beside them in the suite). Serving
does not wait for it (``RECOVERY_S``): the frontend routes on the entries it kept."""
LOOPS = 8
IN_FLIGHT_AT_KILL = LOOPS // 2
"""The kill waits until this many streams have their first token and not their last."""


def test_serves_own_nats_server_killed_under_load() -> None:
    served = start_serve(*MOCK, "--workers", "2", timeout_s=120, env=SERVE_ENV)
    try:
        [old] = children(served, b"nats-server")

        async def kill() -> None:
            os.kill(old, signal.SIGKILL)  # serve restarts it on the same port (backoff 0.5 s)

        asyncio.run(_nats_outage(served, kill))
        assert "nats-server exited with signal 9 (SIGKILL); restart 1 in 0.5 s" in "".join(served.lines)
        assert children(served, b"nats-server") not in ([], [old])
    finally:
        served.stop()


def test_an_external_nats_server_killed_and_restarted_under_load() -> None:
    with NatsServer(port=free_port(), auth=AUTH) as nats:
        served = start_serve(*MOCK, "--workers", "2", "--nats-url", nats.url, timeout_s=120, env=SERVE_ENV)
        try:

            async def kill() -> None:
                assert nats.pid is not None
                os.kill(nats.pid, signal.SIGKILL)
                await asyncio.sleep(1.0)
                nats.restart()  # on this (the main) thread: see NatsServer.restart

            asyncio.run(_nats_outage(served, kill))
        finally:
            served.stop()


async def _nats_outage(served: Served, kill: Callable[[], Awaitable[None]]) -> None:
    assert await wait_for(lambda: len(instance_ids(served)) == 2, 10)
    c = client(served, timeout_s=30)
    results: list[Result] = []
    stop = asyncio.Event()

    def loop(k: int) -> Awaitable[None]:
        return stream_loop(c, k, 60, results, stop)

    async def discovery_back() -> float:
        """When a fresh client of the NATS server sees both workers again (they re-register). An
        attempt gives up after 1 s (a loopback connect takes milliseconds): one that waited 3 s on
        the restarting server put up to 3 s of the probe's own into the figure."""
        while True:
            with contextlib.suppress(Exception):
                rt = await asyncio.wait_for(connect_runtime(url, runtime_config(connect_timeout=0.5)), 1.0)
                try:
                    if len(await rt.discovery.instances(GENERATE_ENDPOINT)) == 2:
                        return time.monotonic()
                finally:
                    await rt.close()
            await asyncio.sleep(0.2)

    url = nats_url(served)

    def in_flight() -> int:
        return sum(1 for r in results if r.first_token_at and not r.ended)

    loops = [asyncio.create_task(loop(k)) for k in range(LOOPS)]
    # No await between this check and ``killed_at``: these streams are still in flight at the kill.
    assert await wait_for(lambda: in_flight() >= IN_FLIGHT_AT_KILL, 60), f"{in_flight()} streams in flight"
    killed_at = time.monotonic()
    await kill()
    back = asyncio.create_task(discovery_back())
    await asyncio.sleep(RECOVERY_S + 3.0)
    stop.set()
    await asyncio.gather(*loops)
    discovered_at: float | None = None
    with contextlib.suppress(TimeoutError):
        discovered_at = await asyncio.wait_for(back, max(0.0, killed_at + REJOIN_S - time.monotonic()))

    streaming = [r for r in results if r.first_token_at and r.first_token_at < killed_at < r.ended]
    new_ok = [r.ended - killed_at for r in results if r.started > killed_at and not r.error]
    failed = [r for r in results if r.error]
    recovery = min(new_ok, default=float("inf"))
    print(
        f"{len(results)} requests, {len(streaming)} streaming at the kill, {len(failed)} failed; "
        f"first new request completed {recovery:.2f} s after the kill; both workers in discovery "
        f"again after {discovered_at - killed_at if discovered_at else float('inf'):.2f} s"
    )
    assert len(streaming) >= IN_FLIGHT_AT_KILL
    assert not [r.error for r in streaming if r.error]
    assert recovery < RECOVERY_S
    late = [r.error for r in failed if r.started > killed_at + RECOVERY_S]
    assert not late, late[:5]

    assert discovered_at is not None, "the workers never came back into discovery"
    assert discovered_at - killed_at < REJOIN_S
    assert await wait_for(lambda: httpx.get(served.url + "/health", timeout=5).status_code == 200, 10)
    await check_pools(served, expected=2)
