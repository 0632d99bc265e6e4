"""The design documents' deployment file (``examples/cluster.yaml``: the seed's file with real
values in place of its placeholders) starts ``interlock serve -f`` with two prefill and four
decode workers of the real model, and serves chat completions through the disaggregated path.

Flags shrink each worker's KV pool and context (this machine has two cores for six workers);
the file itself is used as written.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.e2e.conftest import Served, start_serve, wait_until

pytestmark = pytest.mark.slow
SEED = Path(__file__).resolve().parents[2] / "examples" / "cluster.yaml"


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    s = start_serve(
        "-f", str(SEED), "--num-blocks", "128", "--max-model-len", "1024", "--threads", "1", timeout_s=600
    )
    yield s
    s.stop()


def test_the_seed_file_serves_disaggregated(served: Served) -> None:
    assert "with 6 workers: 4 decode, 2 prefill (policy least-loaded" in "".join(served.lines)
    client = openai.OpenAI(base_url=served.base_url, api_key="none", max_retries=0)
    r = client.chat.completions.with_raw_response.create(
        model="SmolLM2-135M-Instruct",
        max_tokens=12,
        temperature=0,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        extra_headers={"x-interlock-explain": "1", "x-business-line": "search"},
    )
    assert "Paris" in r.parse().choices[0].message.content

    def reported() -> int:  # workers report at least every export_interval (10s in the file)
        text = httpx.get(served.url + "/metrics", timeout=10).text
        return sum(line.startswith("interlock_worker_kv_blocks_capacity{") for line in text.splitlines())

    assert wait_until(lambda: reported() == 6, 30)
    metrics = httpx.get(served.url + "/metrics", timeout=10).text
    assert "interlock_disagg_choices_total{" in metrics  # the request went through the disaggregated path
    assert "interlock_worker_busy_seconds_total{" in metrics  # collect_gpu_utilization: true
