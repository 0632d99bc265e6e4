"""End to end: two workers of one model whose weights leave when idle (``--offload-after``).
The first request wakes one of them as it arrives (the router's prefetch); the requests after it
stay on that warm worker (the router prices the other's return), so the other's weights stay out."""

from __future__ import annotations

import json
import re
import urllib.request

import openai
import pytest

from tests.e2e.conftest import Served, start_serve, wait_until

pytestmark = pytest.mark.slow

OUT = "interlock_worker_weights_out_seconds"
PREFETCHES = "interlock_router_weight_prefetches_total"


def _samples(served: Served, name: str) -> dict[str, float]:
    """``name``'s samples on the frontend's /metrics, by their label text."""
    with urllib.request.urlopen(f"{served.base_url.removesuffix('/v1')}/metrics", timeout=10) as r:
        text = r.read().decode()
    found = {}
    for line in text.splitlines():
        m = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
        if m:
            found[m.group(1)] = float(m.group(2))
    return found


@pytest.fixture(scope="module")
def served() -> Served:
    s = start_serve("--workers", "2", "--offload-after", "3", "--kv-cache-gib", "0.125")
    yield s
    s.stop()


def test_a_warm_worker_keeps_the_traffic_and_the_offloaded_one_stays_out(served: Served) -> None:
    client = openai.OpenAI(base_url=served.base_url, api_key="none", max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    both_out = wait_until(lambda: sum(v > 0 for v in _samples(served, OUT).values()) == 2, 60)
    assert both_out, _samples(served, OUT)
    for i in range(4):
        text = client.completions.create(
            model=model, prompt=f"Question {i}: the capital of France is", max_tokens=4
        )
        assert text.choices[0].text
    # One prefetch, for the first request; the other three went to the warm worker.
    assert _samples(served, PREFETCHES) == {'outcome="loaded"': 1.0}
    waits = _samples(served, OUT)
    assert sorted(v > 0 for v in waits.values()) == [False, True], waits
    # The dashboard's picture says which worker's weights are out, and how long they would take.
    workers = _dashboard(served)["cluster"]["workers"]
    assert sorted(w["weights_out_s"] > 0 for w in workers) == [False, True], workers


def _dashboard(served: Served) -> dict:  # type: ignore[type-arg]
    """The dashboard stream's first message."""
    url = f"{served.base_url.removesuffix('/v1')}/dashboard/events"
    with urllib.request.urlopen(url, timeout=10) as r:
        for raw in r:
            line = raw.decode().strip()
            if line.startswith("data: "):
                return json.loads(line[6:])  # type: ignore[no-any-return]
    raise AssertionError("the dashboard stream ended without a message")
