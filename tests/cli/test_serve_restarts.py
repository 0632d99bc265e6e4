"""``interlock serve --runner mock`` restarts a SIGKILLed worker and its SIGKILLed nats-server."""

from __future__ import annotations

import os
import re
import signal
import socket
from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.conftest import FAST_LEASES, Served, children, start_serve, wait_until

pytestmark = pytest.mark.slow

MOCK = (
    "--runner",
    "mock",
    "--workers",
    "2",
    "--max-model-len",
    "1024",
    "--num-blocks",
    "256",
    "--drain-grace",
    "2",
    *FAST_LEASES,
)
MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture
def served() -> Iterator[Served]:
    s = start_serve(*MOCK, timeout_s=120)
    yield s
    s.stop()


def registered(served: Served) -> set[str]:
    text = httpx.get(served.url + "/metrics", timeout=10).text
    return {
        line.split('worker="', 1)[1].split('"', 1)[0]
        for line in text.splitlines()
        if line.startswith("interlock_worker_kv_blocks_capacity{")
    }


def log(served: Served) -> str:
    return "".join(served.lines)


def test_a_killed_worker_is_restarted_and_serves_again(served: Served) -> None:
    assert wait_until(lambda: len(registered(served)) == 2, 10)
    before = children(served, b"worker")
    assert len(before) == 2
    victim = before[0]
    os.kill(victim, signal.SIGKILL)
    exited = re.compile(r"(worker-\d) exited with signal 9 \(SIGKILL\); restart 1 in 0.5 s")
    # the serve's output is read by a thread, so wait for each line; and the children are read
    # from /proc, where a process serve is starting can show for a moment with serve's own
    # command line (``--workers``): wait for the exact set, the survivor and the restarted pid
    assert wait_until(lambda: len(exited.findall(log(served))) == 1, 15), log(served)[-3000:]
    [name] = exited.findall(log(served))
    restarted = re.compile(rf"{name} restarted \(pid (\d+)\)")
    assert wait_until(lambda: restarted.search(log(served)) is not None, 15), log(served)[-3000:]
    match = restarted.search(log(served))
    assert match is not None
    new = int(match.group(1))
    assert new not in before
    expected = sorted({new} | (set(before) - {victim}))
    assert wait_until(lambda: children(served, b"worker") == expected, 15), (
        expected,
        children(served, b"worker"),
        log(served)[-3000:],
    )
    ready = re.compile(rf"\[{name}\] worker w\d+-\w+ ready:")
    assert wait_until(lambda: len(ready.findall(log(served))) == 2, 30)  # once at start, once now
    assert wait_until(lambda: len(registered(served)) == 2, 10), log(served)[-3000:]
    for i in range(4):
        r = httpx.post(
            served.base_url + "/completions",
            timeout=30,
            json={"model": MODEL, "prompt": f"Hello {i}", "max_tokens": 3, "temperature": 0},
        )
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"]


def test_a_killed_nats_server_comes_back_on_the_same_port(served: Served) -> None:
    [ready] = [ln for ln in served.lines if "Interlock serving" in ln]
    port = int(ready.rsplit(":", 1)[1].rstrip(")\n"))
    [nats] = children(served, b"nats-server")
    os.kill(nats, signal.SIGKILL)

    def back() -> bool:
        pids = children(served, b"nats-server")
        if len(pids) != 1 or pids[0] == nats:
            return False
        with socket.socket() as s:
            s.settimeout(0.5)
            return s.connect_ex(("127.0.0.1", port)) == 0

    assert wait_until(back, 15), log(served)[-3000:]
    assert "nats-server exited with signal 9 (SIGKILL); restart 1 in 0.5 s" in log(served)
    assert wait_until(lambda: "nats-server restarted (pid" in log(served), 5)
    assert served.process.poll() is None


def test_a_sigtermed_worker_drains_and_is_restarted_while_health_stays_200(served: Served) -> None:
    """A SIGTERM from outside (not serve's decision) drains the worker and it exits 0: serve
    starts it again, and /health never leaves 200 while the other worker serves."""
    assert wait_until(lambda: len(registered(served)) == 2, 10)
    before = children(served, b"worker")
    statuses: list[int] = []
    os.kill(before[0], signal.SIGTERM)
    exited = re.compile(r"(worker-\d) exited with code 0; restart 1 in 0.5 s")

    def watched() -> bool:
        statuses.append(httpx.get(served.url + "/health", timeout=10).status_code)
        return "restarted (pid" in log(served) and len(registered(served)) == 2

    assert wait_until(watched, 30), log(served)[-3000:]
    assert len(exited.findall(log(served))) == 1, log(served)[-3000:]
    assert set(statuses) == {200}, statuses
    assert len(children(served, b"worker")) == 2
    r = httpx.post(
        served.base_url + "/completions",
        timeout=30,
        json={"model": MODEL, "prompt": "Hello", "max_tokens": 3, "temperature": 0},
    )
    assert r.status_code == 200, r.text
