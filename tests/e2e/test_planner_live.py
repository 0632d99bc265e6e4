"""The live planner (issue 13): `interlock serve --planner reactive` with mock workers under a
stepped load from the official openai client (low, high, low). The fleet grows one worker at a
time while the load is high, shrinks one at a time after it falls, and no request fails; the
sequence of decisions is read back from the planner's status (``GET /planner``) and through
`interlock planner status`."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.conftest import FAST_LEASES, ROOT, Served, children, start_serve, wait_until

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
SERVE = (
    "--runner",
    "mock",
    "--max-model-len",
    "512",
    "--num-blocks",
    "256",
    "--workers",
    "1",
    "--max-num-seqs",
    "2",
    "--drain-grace",
    "5",
    "--speedup",
    "2",
    *FAST_LEASES,
    "--planner",
    "reactive",
    "--min-workers",
    "1",
    "--max-workers",
    "3",
    "--planner-interval-s",
    "0.25",
    "--planner-window-s",
    "3",
    "--ramp-s",
    "1",
    "--planner-port",
    "0",
)
LOW, HIGH = 1, 12
"""Concurrent clients: one keeps at most one request per worker in flight (nothing waits);
twelve keep about ten waiting at one worker of two slots (the reactive threshold is two)."""


@dataclass
class Load:
    clients: int = 0
    ok: int = 0
    failed: list[str] = field(default_factory=list)


def planner_url(served: Served) -> str:
    for line in served.lines:
        m = re.search(r"Planner \(reactive\) status at (http://\S+)/planner", line)
        if m:
            return m.group(1)
    raise AssertionError("serve printed no planner status address:\n" + "".join(served.lines[-30:]))


def status(url: str) -> dict[str, Any]:
    body: dict[str, Any] = httpx.get(url + "/planner", timeout=10).json()
    return body


def kinds(url: str) -> list[str]:
    return [d["kind"] for d in status(url)["decisions"]]


async def one_client(c: openai.AsyncOpenAI, load: Load, index: int, stop: asyncio.Event) -> None:
    n = 0
    while not stop.is_set() and index < load.clients:
        n += 1
        try:
            r = await c.completions.create(
                model=MODEL,
                prompt=f"client {index} request {n}: tell me a story",
                max_tokens=24,
                temperature=0,
                extra_body={"ignore_eos": True},
            )
            if r.usage is None or r.usage.completion_tokens != 24:
                load.failed.append(f"client {index}: {r.usage}")
            else:
                load.ok += 1
        except openai.OpenAIError as e:
            load.failed.append(f"client {index}: {e!r}")


async def phase(
    c: openai.AsyncOpenAI, load: Load, clients: int, url: str, want: list[str] | None, timeout_s: float
) -> float:
    """Run ``clients`` concurrent clients until the planner's decisions are ``want`` (None: for
    the whole timeout); the seconds it took."""
    load.clients = clients
    stop = asyncio.Event()
    tasks = [asyncio.create_task(one_client(c, load, i, stop)) for i in range(clients)]
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s and await asyncio.to_thread(kinds, url) != want:
        await asyncio.sleep(0.25)
    stop.set()
    await asyncio.gather(*tasks)
    return time.monotonic() - t0


def test_the_fleet_follows_a_stepped_load_one_worker_at_a_time_without_failing_a_request() -> None:
    served = start_serve(*SERVE, timeout_s=120)
    try:
        url = planner_url(served)
        load = Load()

        async def run() -> list[float]:
            c = openai.AsyncOpenAI(base_url=served.base_url, api_key="none", max_retries=0, timeout=60)
            took = [
                await phase(c, load, LOW, url, None, 3.0),  # low: the fleet keeps one
                await phase(c, load, HIGH, url, ["add", "add"], 45.0),  # high: grows to three
                await phase(c, load, LOW, url, ["add", "add", "remove", "remove"], 40.0),
            ]
            await c.close()
            return took

        took = asyncio.run(run())
        st = status(url)
        decisions = st["decisions"]
        assert [d["kind"] for d in decisions] == ["add", "add", "remove", "remove"], (took, decisions)
        assert all("queue" in d["reason"] for d in decisions[:2]), decisions
        assert all("over 3s queue" in d["reason"] for d in decisions[2:]), decisions
        # one step, then half the window (grow_window_s's default) to watch it
        assert decisions[1]["at"] - decisions[0]["at"] >= 1.5
        assert load.failed == [] and load.ok > 0, load.failed[:5]
        assert st["errors"] == 0
        # The removed workers drained and stopped: one worker process is left.
        assert wait_until(lambda: len(children(served, b"worker_main")) == 1, 30.0), children(
            served, b"worker_main"
        )
        out = subprocess.run(
            [sys.executable, "-m", "interlock.cli.main", "planner", "status", "--url", url],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.count("add both worker") == 2 and out.stdout.count("remove w") == 2, out.stdout
        print(
            f"\nplanner live: {load.ok} requests ok, {len(load.failed)} failed; phases took "
            f"{', '.join(f'{t:.1f}s' for t in took)}\n" + out.stdout
        )
    finally:
        served.stop()
