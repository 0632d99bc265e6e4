"""``interlock frontend`` against a deployment with a prefill and a decode worker disaggregates
as ``interlock serve -f`` does: no request runs whole on the prefill worker.

Real processes (nats-server, two ``interlock worker`` with the mock runner, ``interlock
frontend``) and the official ``openai`` client; the routing decision comes back in
``x-interlock-route`` (``x-interlock-explain: 1``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from interlock.runtime import NatsServer
from tests.e2e.conftest import free_port

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
MOCK = (
    "--runner",
    "mock",
    "--max-model-len",
    "1024",
    "--num-blocks",
    "256",
    "--speedup",
    "20",
    "--heartbeat-interval",
    "0.25",
    "--heartbeat-timeout",
    "2",
)


def spawn(*argv: str) -> subprocess.Popen[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "INTERLOCK_LOG_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "interlock.cli.main", *argv],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        stdin=subprocess.DEVNULL,
    )


def wait_for_line(proc: subprocess.Popen[str], marker: str, lines: list[str], timeout_s: float) -> None:
    found = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if marker in line:
                found.set()

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while not found.wait(0.2):
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"no {marker!r}:\n" + "".join(lines[-40:]))


@pytest.fixture(scope="module")
def deployment() -> Iterator[tuple[str, str]]:
    """(frontend base URL, NATS URL) with workers p (prefill) and d (decode) registered."""
    procs: list[subprocess.Popen[str]] = []
    with NatsServer() as nats:
        try:
            logs: dict[str, list[str]] = {"p": [], "d": [], "frontend": []}
            for wid, role in (("p", "prefill"), ("d", "decode")):
                procs.append(
                    spawn("worker", "--nats-url", nats.url, "--instance-id", wid, "--role", role, *MOCK)
                )
                wait_for_line(procs[-1], f"worker {wid} ready", logs[wid], 120)
            port = free_port()
            procs.append(
                spawn(
                    "frontend",
                    "--nats-url",
                    nats.url,
                    "--port",
                    str(port),
                    "--heartbeat-interval",
                    "0.25",
                    "--heartbeat-timeout",
                    "2",
                )
            )
            wait_for_line(procs[-1], "frontend at", logs["frontend"], 120)
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 30
            while httpx.get(url + "/health", timeout=5).status_code != 200:
                assert time.monotonic() < deadline, "frontend never healthy"
                time.sleep(0.2)
            yield url, nats.url
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)


def test_frontend_disaggregates_like_serve(deployment: tuple[str, str]) -> None:
    url, _ = deployment
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    served_by = []
    for i in range(12):
        r = client.chat.completions.with_raw_response.create(
            model="SmolLM2-135M-Instruct",
            max_tokens=8,
            temperature=0,
            messages=[{"role": "user", "content": f"request {i}: " + "tell me a story " * (1 + i)}],
            extra_headers={"x-interlock-explain": "1"},
        )
        assert r.parse().choices[0].finish_reason in ("stop", "length")
        served_by.append(re.search(r"worker=([^;]+)", r.headers["x-interlock-route"]).group(1))
    assert served_by == ["d"] * 12  # the prefill worker never serves a whole request
    metrics = httpx.get(url + "/metrics", timeout=10).text
    choices = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("interlock_disagg_choices_total{")
    )
    assert choices == 12  # every request went through the disaggregation choice


def _status(nats_url: str, wid: str) -> dict:
    """The worker's control status, as ``interlock worker control status`` prints it."""
    proc = spawn("worker", "control", "status", "--instance-id", wid, "--nats-url", nats_url)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    return json.loads(out.strip().splitlines()[-1])


def test_the_decode_worker_copies_each_prompt_straight_from_the_prefill_cache(
    deployment: tuple[str, str],
) -> None:
    """The prefill worker's cache is shared by default (a CPU prefill worker), so every pull
    on this host is the one copy: counted per transport by the decode worker, and afterwards no
    block and no transfer is left on either side; the greedy output equals the one served
    without a transfer. A second frontend on the same workers
    prefills every request remotely (``--enforce-disagg``: the mock's modelled times would
    keep short prompts local)."""
    url, nats_url = deployment
    prompts = [f"one copy {i} " * 40 for i in range(4)]
    plain = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    # The first frontend's own choice (prefilled on the decode worker itself, as the mock's
    # times make it) gives the greedy text to compare with.
    want = [
        plain.completions.create(model="SmolLM2-135M-Instruct", prompt=p, max_tokens=8, temperature=0)
        .choices[0]
        .text
        for p in prompts
    ]
    assert all(want)
    before = _status(nats_url, "d")["pulls_by_transport"]
    port = free_port()
    frontend = spawn("frontend", "--nats-url", nats_url, "--port", str(port), "--enforce-disagg")
    try:
        wait_for_line(frontend, "frontend at", [], 120)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
        for p, text in zip(prompts, want, strict=True):
            r = client.completions.create(
                model="SmolLM2-135M-Instruct", prompt=p, max_tokens=8, temperature=0
            )
            assert r.choices[0].text == text  # the same greedy output through the one copy
            # the prefill worker's cache hit (a prompt it never saw), not the decode worker's
            # import of the whole prompt
            assert r.usage is not None and r.usage.prompt_tokens_details is not None
            assert r.usage.prompt_tokens_details.cached_tokens == 0 < r.usage.prompt_tokens
    finally:
        frontend.terminate()
        frontend.wait(20)
    d = _status(nats_url, "d")
    assert d["pulls_by_transport"] == {**before, "direct": before.get("direct", 0) + 4}
    deadline = time.monotonic() + 10
    while True:  # the prefill side frees its blocks once it sees DONE
        p, d = _status(nats_url, "p"), _status(nats_url, "d")
        if p["kv_blocks_used"] == d["kv_blocks_used"] == p["live_transfers"] == d["live_transfers"] == 0:
            break
        assert time.monotonic() < deadline, (p, d)
        time.sleep(0.2)
