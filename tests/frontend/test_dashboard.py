"""The dashboard's figures (samples differenced into rates and means), its snapshot, and its two
paths behind API keys: a header or the cookie that ``/dashboard?key=`` sets, never on the API."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from interlock.frontend import FrontendConfig
from interlock.frontend.auth import AuthConfig
from interlock.frontend.dashboard import EVENTS_SHOWN, History, Point, Sample, difference, read, snapshot
from interlock.frontend.dashboard_http import Dashboard, _page
from interlock.frontend.fake import FakeBackend
from interlock.frontend.metrics import FrontendMetrics
from interlock.metrics.events import Event, EventLog
from tests.frontend.conftest import Served, serving

KEY = "sk-dash"


def sample(at: float, **fields: float) -> Sample:
    base = dict.fromkeys(
        (
            "requests",
            "errors",
            "in_flight",
            "prompt_tokens",
            "completion_tokens",
            "cached_tokens",
            "ttft_sum",
            "ttft_count",
            "itl_sum",
            "itl_count",
        ),
        0.0,
    )
    return Sample(at=at, **{**base, **fields})


def test_a_second_s_rates_and_means_are_differences_of_two_samples() -> None:
    prev = sample(10.0, requests=4, completion_tokens=100, prompt_tokens=50, ttft_sum=0.4, ttft_count=4)
    cur = sample(
        12.0, requests=8, completion_tokens=300, prompt_tokens=90, ttft_sum=1.0, ttft_count=6, itl_sum=0.2
    )
    point = difference(prev, cur)
    assert point.at == 12.0
    assert (point.requests_per_s, point.tokens_per_s, point.prompt_tokens_per_s) == (2.0, 100.0, 20.0)
    assert point.ttft_s == pytest.approx(0.3)  # (1.0 - 0.4) s over 2 first tokens
    assert point.itl_s is None  # a sum with no count: nothing observed, not zero


def test_no_time_or_a_counter_that_went_down_gives_no_rate() -> None:
    assert difference(sample(5.0, requests=3), sample(5.0, requests=9)).requests_per_s == 0.0
    assert difference(sample(5.0, requests=9), sample(6.0, requests=3)).requests_per_s == 0.0


def test_the_history_keeps_its_last_sample_and_the_last_points_between_two() -> None:
    history = History(capacity=3)
    assert history.add(sample(0.0)) is None and history.last == sample(0.0)
    for t in range(1, 6):
        point = history.add(sample(float(t), requests=float(t * t)))
        assert isinstance(point, Point) and point.requests_per_s == 2 * t - 1
    assert history.last == sample(5.0, requests=25.0)
    assert [p.requests_per_s for p in history.points] == [5.0, 7.0, 9.0]


def test_a_reading_sums_every_model_and_finish_reason() -> None:
    m = FrontendMetrics()
    m.finished.inc(("a", "stop"), 3)
    m.finished.inc(("b", "error"))
    m.completion_tokens.inc(("a",), 40)
    m.completion_tokens.inc(("b",), 2)
    m.prompt_tokens.inc(("a",), 10)
    m.cached_tokens.inc(("a",), 4)
    m.ttft.observe(0.25, ("a",))
    m.itl.observe(0.01, ("a",), count=5)
    m.in_flight.inc()
    s = read(m, 7.0)
    assert (s.at, s.requests, s.errors, s.in_flight) == (7.0, 4.0, 1.0, 1.0)
    assert (s.completion_tokens, s.prompt_tokens, s.cached_tokens) == (42.0, 10.0, 4.0)
    assert (s.ttft_sum, s.ttft_count, s.itl_count) == (0.25, 1.0, 5.0)
    assert s.itl_sum == pytest.approx(0.05)


def test_a_snapshot_carries_totals_columns_the_cluster_and_the_newest_events() -> None:
    history = History()
    history.add(sample(1.0))
    history.add(sample(2.0, requests=2, prompt_tokens=100, cached_tokens=25, ttft_sum=0.5, ttft_count=2))
    events = [Event(float(i), "worker_joined", f"w{i}", "") for i in range(EVENTS_SHOWN + 5)]
    snap = snapshot(
        history, {"workers": [], "models": {}}, events[-EVENTS_SHOWN:], now=3.0
    )  # recent(EVENTS_SHOWN)
    assert snap["time"] == 3.0
    assert snap["totals"] == {
        "requests": 2.0,
        "errors": 0.0,
        "in_flight": 0.0,
        "prompt_tokens": 100.0,
        "completion_tokens": 0.0,
        "cached_tokens": 25.0,
        "cache_hit_rate": 0.25,
    }
    assert snap["series"] == {
        "time": [2.0],
        "requests_per_s": [2.0],
        "tokens_per_s": [0.0],
        "prompt_tokens_per_s": [100.0],
        "ttft_ms": [250.0],
        "itl_ms": [None],
    }
    shown = snap["events"]
    assert isinstance(shown, list) and len(shown) == EVENTS_SHOWN
    assert shown[-1] == {
        "time": float(EVENTS_SHOWN + 4),
        "kind": "worker_joined",
        "subject": "w54",
        "reason": "",
    }
    assert snapshot(History(), None, [], now=0.0)["cluster"] is None


class ClusterBackend(FakeBackend):
    def cluster_view(self) -> dict[str, object]:
        return {"workers": [{"id": "w1"}], "models": {}}


def test_the_stream_s_message_has_the_backend_s_picture_when_it_draws_one() -> None:
    log = EventLog(capacity=2, clock=lambda: 100.0)
    for subject in ("a", "b", "c"):
        log.record("restart", subject, "exit -9")
    board = Dashboard(FrontendMetrics(), ClusterBackend([]), events=log, clock=lambda: 5.0)
    board.sample()
    message = board.message()
    assert message.startswith(b"data: ") and message.endswith(b"\n\n")
    body = json.loads(message[6:])
    assert body["cluster"] == {"workers": [{"id": "w1"}], "models": {}}
    assert [e["subject"] for e in body["events"]] == ["b", "c"]
    plain = Dashboard(FrontendMetrics(), FakeBackend([]), events=log, clock=lambda: 5.0)
    assert json.loads(plain.message()[6:])["cluster"] is None


def test_the_page_is_self_contained() -> None:
    page = _page().decode()
    assert 'new EventSource("/dashboard/events")' in page
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)  # no CDN, nothing fetched
    assert "innerHTML" not in page  # the cluster's names are shown as text, never parsed


@pytest.fixture(scope="module")
def keyed(smol_path: Path) -> Iterator[Served]:
    with serving(smol_path, FrontendConfig(auth=AuthConfig(api_keys=(KEY, "other")))) as s:
        yield s


def first_message(http: httpx.Client, path: str, **kwargs: object) -> dict[str, object]:
    with http.stream("GET", path, **kwargs) as r:  # type: ignore[arg-type]
        assert r.status_code == 200 and r.headers["content-type"] == "text/event-stream"
        for line in r.iter_lines():
            if line.startswith("data: "):
                return dict(json.loads(line[6:]))
    raise AssertionError("the stream ended without a message")


def test_with_keys_the_dashboard_needs_one_and_the_page_s_key_becomes_a_cookie(keyed: Served) -> None:
    with httpx.Client(base_url=keyed.url, timeout=10) as http:
        for path in (
            "/dashboard",
            "/dashboard/events",
            "/dashboard?key=wrong",
            "/dashboard/events?key=" + KEY,
        ):
            r = http.get(path)
            assert r.status_code == 401 and "/dashboard?key=" in r.json()["error"]["message"], path
        page = http.get("/dashboard", headers={"Authorization": f"Bearer {KEY}"})
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "default-src 'none'" in page.headers["content-security-policy"]
        assert first_message(http, "/dashboard/events", headers={"Authorization": f"Bearer {KEY}"})["totals"]

        r = http.get(f"/dashboard?key={KEY}")
        assert r.status_code == 303 and r.headers["location"] == "/dashboard"
        cookie = r.headers["set-cookie"]
        assert cookie.startswith(f"interlock_key={KEY};")
        assert {"HttpOnly", "Path=/dashboard", "SameSite=Strict"} <= {p.strip() for p in cookie.split(";")}
        http.cookies.clear()
        sent = {"Cookie": f"interlock_key={KEY}"}
        assert http.get("/dashboard", headers=sent).status_code == 200
        assert "series" in first_message(http, "/dashboard/events", headers=sent)
        assert http.get("/v1/models", headers=sent).status_code == 401  # the cookie is for the dashboard only
        assert http.get("/dashboard", headers={"Cookie": "interlock_key=wrong"}).status_code == 401


def test_a_browser_at_the_root_goes_to_the_dashboard_and_others_get_a_404(served: Served) -> None:
    with httpx.Client(base_url=served.url, timeout=10) as http:
        r = http.get("/", headers={"Accept": "text/html,application/xhtml+xml"})
        assert r.status_code == 302 and r.headers["location"] == "/dashboard"
        assert http.get("/", headers={"Accept": "application/json"}).status_code == 404
        assert http.post("/", headers={"Accept": "text/html"}).status_code == 404
        assert http.get("/dashboard").status_code == 200  # no keys: open like every path
        assert first_message(http, "/dashboard/events")["cluster"] is None  # a fake backend draws none
