"""The planner with vLLM workers: `interlock serve --engine vllm --planner reactive` starts one
vLLM worker, adds a second under a queue (its start-up, tens of seconds, is waited for: the
planner holds while a worker starts), and drains one away when the load falls; no request fails.
Skipped where vLLM is not installed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import openai
import pytest

from interlock.engine import vllm
from tests.e2e.conftest import FAST_LEASES, children, start_serve, wait_until
from tests.e2e.test_planner_live import Load, kinds, phase, planner_url, status

if not vllm.installed():
    pytest.skip(f"vLLM is not installed ({vllm.INSTALL_HINT})", allow_module_level=True)

pytestmark = pytest.mark.slow

SERVE = (
    "--engine", "vllm", "--engine-arg", "enforce_eager=true", "--dtype", "float32",
    "--max-model-len", "512", "--kv-cache-gib", "0.25", "--workers", "1", "--max-num-seqs", "2",
    "--drain-grace", "20", *FAST_LEASES, "--planner", "reactive", "--min-workers", "1",
    "--max-workers", "2", "--planner-interval-s", "0.25", "--planner-window-s", "3", "--ramp-s", "1",
    "--planner-port", "0",
)  # fmt: skip
LOW, HIGH = 1, 8


@pytest.mark.timeout(1200)  # two vLLM starts under load: 130 s alone, 220-360 s beside the suite
def test_the_planner_adds_and_drains_a_vllm_worker_without_failing_a_request(tmp_path: Path) -> None:
    # vLLM's eager decode here takes 30-45 ms a token: an ITL target it can meet with room,
    # or the pool that decodes never counts as idle enough to shrink.
    cfg = tmp_path / "planner.yaml"
    cfg.write_text("itl_ms: 1000\n")
    served = start_serve(*SERVE, "--planner-config", str(cfg), timeout_s=300)
    try:
        url = planner_url(served)
        load = Load()

        async def run() -> None:
            c = openai.AsyncOpenAI(base_url=served.base_url, api_key="none", max_retries=0, timeout=300)
            await phase(c, load, HIGH, url, ["add"], 240.0)
            # The added vLLM worker starts (tens of seconds) before anything else is decided.
            assert await asyncio.to_thread(wait_until, lambda: len(children(served, b"worker_main")) == 2, 10)
            # The removal then waits, by design, for the load to stay low as long as that start
            # took (a worker removed too early takes that long to come back): twice a vLLM start,
            # 100-150 s apiece beside the rest of the suite on 2 cores.
            await phase(c, load, LOW, url, ["add", "remove"], 600.0)
            await c.close()

        asyncio.run(run())
        st = status(url)
        assert kinds(url) == ["add", "remove"], (st["decisions"], st["wants"], st["holding"])
        assert load.failed == [] and load.ok > 0, load.failed[:5]
        assert st["errors"] == 0
        assert wait_until(lambda: len(children(served, b"worker_main")) == 1, 60)
    finally:
        served.stop()
