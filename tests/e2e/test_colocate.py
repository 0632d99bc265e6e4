"""End to end: two models in one worker process (``colocate``), each its own engine, KV
budget and served name; the guest drops its weights when idle and its next request loads
them back. The second model is SmolLM2 with other weights: a copy of its converted folder
whose final norm is scaled by 0.8 (``model_store.variant``), so the two answer differently."""

from __future__ import annotations

import re
import time
import urllib.request
from pathlib import Path

import openai
import pytest
import yaml

from interlock.model_store import resolve_model
from interlock.model_store.variant import make_variant
from tests.e2e.conftest import Served, start_serve, wait_until

HOST, GUEST = "host-model", "guest-model"
PROMPT = "The capital of France is"
OFFLOAD_AFTER_S = 3.0

pytestmark = pytest.mark.slow


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _complete(client: openai.OpenAI, model: str) -> tuple[str, float, float]:
    """Greedy text, the first token's logprob and the time to the first token."""
    t0 = time.perf_counter()
    stream = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=8, temperature=0, logprobs=1, stream=True
    )
    text, first_lp, ttft = "", None, 0.0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            if first_lp is None:
                ttft = time.perf_counter() - t0
                lps = chunk.choices[0].logprobs
                first_lp = lps.token_logprobs[0] if lps and lps.token_logprobs else 0.0
            text += chunk.choices[0].text
    assert first_lp is not None
    return text, first_lp, ttft


def _metric(served: Served, name: str, label: str) -> float | None:
    """The value of ``name``'s sample whose labels contain ``label`` in the frontend's /metrics."""
    with urllib.request.urlopen(f"{served.base_url.removesuffix('/v1')}/metrics", timeout=10) as r:
        text = r.read().decode()
    for line in text.splitlines():
        m = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
        if m and label in m.group(1):
            return float(m.group(2))
    return None


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Served:
    tmp = tmp_path_factory.mktemp("colocate")
    deployment = {
        "execution-group": {
            "model": "smollm2",
            "served_model_name": HOST,
            "nodes": [{"count": 1, "kv_cache_gib": 0.25}],
            "colocate": [
                {
                    "model": str(make_variant(resolve_model("smollm2", progress=False), tmp / "variant")),
                    "served_model_name": GUEST,
                    "offload_after_s": OFFLOAD_AFTER_S,
                    "nodes": [{"kv_cache_gib": 0.125}],
                }
            ],
        }
    }
    path = tmp / "cluster.yaml"
    path.write_text(yaml.safe_dump(deployment))
    s = start_serve("-f", str(path))
    yield s
    s.stop()


def test_two_models_share_one_worker_process_and_a_guest_comes_back_after_offload(served: Served) -> None:
    client = openai.OpenAI(base_url=served.base_url, api_key="none", max_retries=0, timeout=120)
    assert sorted(m.id for m in client.models.list().data) == sorted([HOST, GUEST])
    (worker,) = served.worker_pids()
    host_text, host_lp, _ = _complete(client, HOST)
    guest_text, guest_lp, warm_ttft = _complete(client, GUEST)
    assert host_text and guest_text
    assert abs(host_lp - guest_lp) > 1e-3  # other weights: another answer
    loaded = _rss_mib(worker)
    # Idle past offload_after_s: the guest's weights leave the process (the host's stay).
    assert wait_until(lambda: _rss_mib(worker) < loaded - 100, OFFLOAD_AFTER_S + 30)
    offloaded = _rss_mib(worker)
    # The router knows: the guest's report says how long its weights take to come back.
    out_s = "interlock_worker_weights_out_seconds"
    assert wait_until(lambda: (_metric(served, out_s, f'model="{GUEST}"') or 0) > 0, 10)
    assert _metric(served, out_s, f'model="{HOST}"') == 0
    again_text, again_lp, cold_ttft = _complete(client, GUEST)
    assert (again_text, round(again_lp, 4)) == (guest_text, round(guest_lp, 4))
    # No warm worker of the guest was free: the request's arrival woke it (a prefetch).
    assert _metric(served, "interlock_router_weight_prefetches_total", 'outcome="loaded"') == 1
    assert wait_until(lambda: _metric(served, out_s, f'model="{GUEST}"') == 0, 10)
    assert _complete(client, HOST)[0] == host_text
    assert served.worker_pids() == [worker]
    print(
        f"RSS loaded {loaded:.0f} MiB, guest offloaded {offloaded:.0f} MiB; guest TTFT warm "
        f"{warm_ttft * 1e3:.0f} ms, after offload {cold_ttft * 1e3:.0f} ms"
    )
