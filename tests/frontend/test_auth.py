"""API keys (401 in OpenAI's shape, open operational paths) and per-key rate limits (429)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from interlock.errors import ConfigError
from interlock.frontend import FrontendConfig
from interlock.frontend.auth import AuthConfig, TokenBucket
from tests.frontend.conftest import MODEL, Served, serving

KEYS = ("key-one", "key-two")


@pytest.fixture(scope="module")
def keyed(smol_path: Path) -> Iterator[Served]:
    with serving(smol_path, FrontendConfig(auth=AuthConfig(api_keys=KEYS))) as s:
        yield s


@pytest.fixture(scope="module")
def limited(smol_path: Path) -> Iterator[Served]:
    auth = AuthConfig(api_keys=KEYS, requests_per_minute=3, tokens_per_minute=200)
    with serving(smol_path, FrontendConfig(auth=auth)) as s:
        yield s


def client(served: Served, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.url + "/v1", api_key=key, max_retries=0, timeout=20)


def test_requests_without_a_known_key_get_a_401(keyed: Served) -> None:
    for key in ("key-on", "key-one-", "KEY-ONE", "key-one key-two"):
        with pytest.raises(openai.AuthenticationError) as info:
            client(keyed, key).completions.create(model=MODEL, prompt="x", max_tokens=1)
        body = info.value.body
        assert isinstance(body, dict) and body["type"] == "authentication_error" and body["param"] is None
    with httpx.Client(base_url=keyed.url) as http:
        r = http.get("/v1/models", headers={"Authorization": "Basic key-one"})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
        assert http.get("/v1/models").status_code == 401


def test_every_configured_key_works(keyed: Served) -> None:
    for key in KEYS:
        r = client(keyed, key).completions.create(model=MODEL, prompt="x", max_tokens=1)
        assert r.choices[0].text is not None
        assert [m.id for m in client(keyed, key).models.list()]


def test_operational_paths_are_open(keyed: Served) -> None:
    with httpx.Client(base_url=keyed.url) as http:
        assert [http.get(p).status_code for p in ("/health", "/live", "/metrics")] == [200, 200, 200]


def test_requests_per_minute_per_key(limited: Served) -> None:
    with httpx.Client(base_url=limited.url) as http:
        replies = [http.get("/v1/models", headers={"Authorization": "Bearer key-one"}) for _ in range(4)]
        assert [r.status_code for r in replies] == [200, 200, 200, 429]
        error = replies[-1].json()["error"]
        assert error["type"] == "rate_limit_error" and "requests_per_minute" in error["message"]
        assert 1 <= int(replies[-1].headers["retry-after"]) <= 20
        # Another key has its own budget.
        assert http.get("/v1/models", headers={"Authorization": "Bearer key-two"}).status_code == 200


def test_tokens_per_minute_per_key(limited: Served) -> None:
    with pytest.raises(openai.RateLimitError, match="tokens_per_minute"):
        for _ in range(3):  # 300 prompt tokens against 200 a minute; the third at the latest
            client(limited, "key-two").completions.create(model=MODEL, prompt="word " * 100, max_tokens=1)


def test_token_bucket_refills_over_time() -> None:
    now = [0.0]
    bucket = TokenBucket(60, clock=lambda: now[0])
    assert bucket.wait_for(60) == 0
    bucket.take(60)
    assert bucket.wait_for(1) == pytest.approx(1.0)
    now[0] = 30.0
    assert bucket.wait_for(30) == 0 and bucket.wait_for(31) == pytest.approx(1.0)
    assert bucket.wait_for(1000) == pytest.approx(30.0)  # more than a minute's worth: a full bucket
    bucket.take(100)  # a long completion overdraws
    assert bucket.wait_for(1) == pytest.approx(71.0)


def test_auth_config_is_validated() -> None:
    with pytest.raises(ConfigError):
        AuthConfig(api_keys=(" padded",))
    with pytest.raises(ConfigError):
        AuthConfig(requests_per_minute=5)
    with pytest.raises(ConfigError):
        AuthConfig(api_keys=("k",), tokens_per_minute=0)
