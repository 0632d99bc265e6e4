"""Workers dying and draining under ``interlock serve``: no request is lost or left hanging."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.e2e.conftest import FAST_LEASES, Served, start_serve

MODEL = "SmolLM2-135M-Instruct"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def three_workers() -> Served:
    # Workers that die here must stay dead (what discovery and routing do then is the subject);
    # restarts are tested in tests/cli/test_serve_restarts.py.
    served = start_serve(
        "--workers",
        "3",
        "--max-model-len",
        "1024",
        "--num-blocks",
        "256",
        *FAST_LEASES,
        "--restart-policy",
        "never",
    )
    yield served
    served.stop()


def _registered(served: Served) -> set[str]:
    text = httpx.get(served.url + "/metrics", timeout=30).text
    return {
        line.split('worker="', 1)[1].split('"', 1)[0]
        for line in text.splitlines()
        if line.startswith("interlock_worker_kv_blocks_capacity{")
    }


def _pid_of(served: Served, instance_id: str) -> int:
    for pid in served.worker_pids():
        if instance_id.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
            return pid
    raise AssertionError(f"no process for {instance_id}")


def _wait_until(cond, timeout_s: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


def test_sigterm_drains_in_flight_then_sigkill_leaves_discovery(three_workers: Served) -> None:
    served = three_workers
    assert _wait_until(lambda: len(_registered(served)) == 3, 10)
    body = {
        "model": MODEL,
        "prompt": "Count: 1, 2, 3,",
        "max_tokens": 120,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }
    got: dict[str, object] = {}

    def stream() -> None:
        with httpx.stream(
            "POST",
            served.base_url + "/completions",
            json=body,
            timeout=120,
            headers={"x-interlock-explain": "1"},
        ) as r:
            got["route"] = r.headers.get("x-interlock-route", "")
            got["lines"] = [ln for ln in r.iter_lines() if ln.startswith("data:")]

    t = threading.Thread(target=stream)
    t.start()
    assert _wait_until(lambda: "route" in got, 60)
    victim = str(got["route"]).split("worker=", 1)[1].split(";", 1)[0]
    pid = _pid_of(served, victim)
    time.sleep(0.5)
    os.kill(pid, signal.SIGTERM)  # drain: leave discovery, finish the stream, exit
    assert _wait_until(lambda: victim not in _registered(served), 5)
    t.join(120)
    lines = got["lines"]
    assert isinstance(lines, list) and lines[-1] == "data: [DONE]"
    assert sum('"text"' in ln for ln in lines) >= 100  # the whole stream arrived
    metrics = httpx.get(served.url + "/metrics", timeout=30).text
    assert "interlock_router_migrations_total 0" in metrics  # ... from the drained worker itself
    assert _wait_until(
        lambda: not os.path.exists(f"/proc/{pid}") or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z",
        30,
    )

    # SIGKILL another worker: it leaves discovery within the lease timeout (2 s) ...
    left = sorted(_registered(served))
    assert len(left) == 2
    os.kill(_pid_of(served, left[0]), signal.SIGKILL)
    t0 = time.monotonic()
    assert _wait_until(lambda: left[0] not in _registered(served), 6)
    assert time.monotonic() - t0 < 6
    # ... and new requests go to the survivor.
    client = openai.OpenAI(base_url=served.base_url, api_key="none", max_retries=0, timeout=60)
    for _ in range(4):
        r = client.completions.create(model=MODEL, prompt="Hello", max_tokens=3, temperature=0)
        assert r.choices[0].text
    assert _registered(served) == {left[1]}

    # With no worker left the model is still known: 503 with Retry-After, not 404.
    os.kill(_pid_of(served, left[1]), signal.SIGKILL)
    assert _wait_until(lambda: not _registered(served), 6)
    r = httpx.post(
        served.base_url + "/completions",
        timeout=30,
        json={"model": MODEL, "prompt": "Hello", "max_tokens": 3},
    )
    assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
    assert r.json()["error"]["message"]
    assert httpx.get(served.url + "/live", timeout=10).status_code == 200
