"""Reading a body: the size cap (declared or counted), the deadline and the minimum rate."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from interlock.frontend import FrontendConfig
from interlock.frontend.body import BodyRules, body_deadline
from tests.frontend.conftest import MODEL, Served, serving

RULES = BodyRules(max_bytes=10_000, timeout_s=60.0, min_rate=1000, grace_s=2.0)


def test_the_grace_then_the_rate_set_when_the_next_byte_is_due() -> None:
    assert body_deadline(RULES, 100.0, 0) == (102.0, "min_body_rate")
    assert body_deadline(RULES, 100.0, 5000) == (107.0, "min_body_rate")  # 5 s of credit earned
    assert body_deadline(RULES, 100.0, 1_000_000) == (160.0, "body_timeout_s")
    assert body_deadline(replace(RULES, min_rate=0), 100.0, 0) == (160.0, "body_timeout_s")


@pytest.fixture(scope="module")
def small(smol_path: Path) -> Iterator[Served]:
    with serving(smol_path, FrontendConfig(max_body_bytes=2048)) as s:
        yield s


def test_a_body_over_the_cap_is_a_413_whether_declared_or_streamed(small: Served) -> None:
    big = b'{"model": "%s", "prompt": "%s"}' % (MODEL.encode(), b"x" * 4096)
    with httpx.Client(base_url=small.url, timeout=10) as http:
        declared = http.post("/v1/completions", content=big, headers={"content-type": "application/json"})
        streamed = http.post(  # chunked: no length to refuse it by, so it is counted as it comes
            "/v1/completions",
            content=iter([big[:1000], big[1000:]]),
            headers={"content-type": "application/json"},
        )
        fits = http.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 1})
    for r in (declared, streamed):
        assert r.status_code == 413 and "max_body_bytes" in r.json()["error"]["message"]
    assert fits.status_code == 200
