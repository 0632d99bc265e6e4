"""The live dashboard in a real browser (headless Chromium, driven by Playwright) over ``interlock
serve`` with the real model, two workers and an API key: the page opens with ``?key=``, keeps
the key in its cookie for the event stream, its figures move as requests are served, every worker
is a tile, and a SIGKILLed worker's tile leaves and comes back once the supervisor restarts it.

Playwright drives Debian's ``/usr/bin/chromium`` (``scripts/setup.sh`` installs it) and never
downloads a browser of its own. A screenshot is left at ``tmp_path / "dashboard.png"`` and, when
``INTERLOCK_ARTIFACTS`` names a folder, copied there.
"""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.e2e.conftest import FAST_LEASES, Served, start_serve, wait_until

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
MODEL = "SmolLM2-135M-Instruct"
KEY = "sk-dashboard-test"
TILES = "#workers .tile"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="no /usr/bin/chromium (scripts/setup.sh installs it)"),
]
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the test extra)")


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    s = start_serve(
        "--workers",
        "2",
        "--max-model-len",
        "1024",
        "--num-blocks",
        "256",
        *FAST_LEASES,
        "--api-key",
        KEY,
        "--frontend-workers",
        "2",  # the page's stream reaches either process: one dashboard
    )
    yield s
    s.stop()


def tiles(page: Any) -> dict[str, str]:
    """Worker id -> the health its tile shows."""
    found = page.eval_on_selector_all(TILES, "els => els.map(e => [e.dataset.worker, e.dataset.health])")
    return dict(found)


def pid_of(served: Served, instance_id: str) -> int:
    for pid in served.worker_pids():
        if instance_id.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
            return pid
    raise AssertionError(f"no worker process runs {instance_id}")


def test_the_dashboard_follows_the_cluster_live(served: Served, tmp_path: Path) -> None:
    client = openai.OpenAI(base_url=served.base_url, api_key=KEY, max_retries=0, timeout=60)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            # bypass_csp: Playwright's own waits evaluate strings, which the page's policy forbids
            page = browser.new_page(viewport={"width": 1280, "height": 1100}, bypass_csp=True)
            page.goto(f"{served.url}/dashboard?key={KEY}")
            assert page.url == f"{served.url}/dashboard"  # the key left the address for a cookie

            # every worker is a tile, healthy once its first load report is in
            page.wait_for_function(
                f"[...document.querySelectorAll('{TILES}')].filter(t => t.dataset.health === 'healthy')"
                ".length === 2",
                timeout=30_000,
            )
            workers = tiles(page)
            assert len(workers) == 2 and {pid_of(served, w) for w in workers} == set(served.worker_pids())

            # the figures move as requests are served (the page's stream and the other frontend
            # process's figures can lag by seconds on a loaded machine: generous waits)
            assert page.text_content("#stat-requests") == "0"
            for i in range(3):
                r = client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": f"Name a colour ({i})."}], max_tokens=8
                )
                assert r.usage is not None and r.usage.completion_tokens > 0
            page.wait_for_function(
                "document.getElementById('stat-requests').textContent === '3'", timeout=30_000
            )
            assert page.text_content("#stat-tokens") not in ("0", "–")
            page.wait_for_function("document.getElementById('now-ttft').textContent !== '–'", timeout=30_000)
            routing = page.text_content("#routing") or ""
            assert MODEL in routing and "expected cache hit rate" in routing

            # a killed worker's tile leaves (or turns unhealthy), and the restarted one is back
            victim = sorted(workers)[0]
            os.kill(pid_of(served, victim), signal.SIGKILL)
            assert wait_until(lambda: tiles(page).get(victim, "gone") != "healthy", 20), tiles(page)
            page.wait_for_function(
                f"[...document.querySelectorAll('{TILES}')].filter(t => t.dataset.health === 'healthy')"
                ".length === 2",
                timeout=60_000,
            )
            page.wait_for_function(
                "document.getElementById('event-rows').textContent.includes('restart')", timeout=30_000
            )
            events = page.text_content("#event-rows") or ""
            assert "worker_left" in events and "worker_joined" in events
            r = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
            )
            page.wait_for_function(
                "document.getElementById('stat-requests').textContent === '4'", timeout=30_000
            )

            shot = tmp_path / "dashboard.png"
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert shot.stat().st_size > 10_000
    artifacts = os.environ.get("INTERLOCK_ARTIFACTS")
    if artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(artifacts) / "dashboard.png")
    assert KEY not in "".join(served.lines)  # the key is never logged
