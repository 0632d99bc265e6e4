"""Scale to zero (issue 29, item 6): `interlock serve --workers 0 --planner reactive --min-workers 0`
with mock workers. A first request arrives at the empty pool, waits in the router while the
planner starts a worker, and is served; after ``zero_after_s`` with nothing to do the planner
stops the worker (the pool is at zero: no worker process left); a second request is served from
zero again. No request fails because the pool was empty. Decisions are read back from the
planner's status (``GET /planner``) and through `interlock planner status`."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.e2e.conftest import FAST_LEASES, ROOT, children, start_serve, wait_until
from tests.e2e.test_planner_live import MODEL, kinds, planner_url, status

pytestmark = pytest.mark.slow

ZERO_AFTER_S = 3.0


def serve_args(planner_yaml: Path) -> tuple[str, ...]:
    return (
        "--runner",
        "mock",
        "--max-model-len",
        "512",
        "--num-blocks",
        "256",
        "--workers",
        "0",
        "--drain-grace",
        "2",
        *FAST_LEASES,
        "--planner",
        "reactive",
        "--planner-config",
        str(planner_yaml),
        "--min-workers",
        "0",
        "--max-workers",
        "1",
        "--planner-interval-s",
        "0.25",
        "--planner-window-s",
        "1",
        "--ramp-s",
        "0",
        "--planner-port",
        "0",
    )


def waiting_for_worker(base: str) -> float:
    """The frontend's ``interlock_router_waiting_for_worker`` for the model (0 if not shown)."""
    for line in httpx.get(base + "/metrics", timeout=10).text.splitlines():
        if line.startswith(f'interlock_router_waiting_for_worker{{model="{MODEL}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def ask(c: openai.OpenAI, n: int) -> tuple[int, float]:
    """One completion of 8 tokens; (tokens, seconds it took)."""
    t0 = time.monotonic()
    r = c.completions.create(
        model=MODEL,
        prompt=f"request {n}: tell me a story",
        max_tokens=8,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert r.usage is not None
    return r.usage.completion_tokens, time.monotonic() - t0


def test_a_request_at_an_empty_pool_is_served_and_the_pool_returns_to_zero(tmp_path: Path) -> None:
    planner_yaml = tmp_path / "planner.yaml"
    planner_yaml.write_text(f"planner: {{zero_after_s: {ZERO_AFTER_S}}}\n")
    served = start_serve(*serve_args(planner_yaml), timeout_s=120)
    try:
        url = planner_url(served)
        assert children(served, b"worker_main") == []  # it starts at zero
        models = httpx.get(served.base_url + "/models", timeout=10).json()
        assert [m["id"] for m in models["data"]] == [MODEL]  # known before any worker
        # Zero is healthy: 200 once the model's tokenizer has loaded (503 before, seconds on a busy machine).
        assert wait_until(lambda: httpx.get(served.url + "/health", timeout=10).status_code == 200, 60)

        c = openai.OpenAI(base_url=served.base_url, api_key="none", max_retries=0, timeout=60)
        first = ask(c, 1)  # waits while the planner starts a worker
        assert first[0] == 8
        assert kinds(url) == ["add"]
        reason = status(url)["decisions"][0]["reason"]
        assert "requests wait and no both worker runs" in reason, reason
        assert len(children(served, b"worker_main")) == 1

        # Idle for zero_after_s: the planner stops the worker, which drains and exits.
        assert wait_until(lambda: kinds(url) == ["add", "remove"], ZERO_AFTER_S + 20), status(url)
        assert "scaling to zero" in status(url)["decisions"][1]["reason"]
        assert wait_until(lambda: children(served, b"worker_main") == [], 30), children(
            served, b"worker_main"
        )
        assert waiting_for_worker(served.url) == 0

        second = ask(c, 2)  # from zero again
        assert second[0] == 8
        assert kinds(url) == ["add", "remove", "add"]
        st = status(url)
        assert st["errors"] == 0
        c.close()

        out = subprocess.run(
            [sys.executable, "-m", "interlock.cli.main", "planner", "status", "--url", url],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.count("add both worker") == 2, out.stdout
        print(
            f"\nscale to zero: first request {first[1]:.1f}s from zero, second {second[1]:.1f}s\n"
            + out.stdout
        )
    finally:
        served.stop()
