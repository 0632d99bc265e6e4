"""The registry renders text that Prometheus' own parser reads back exactly, makes metrics only
from the catalogue, and the fleet view merges workers' figures family by family."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from interlock.frontend.fleet_metrics import _merge, fleet_text
from interlock.frontend.metrics import FrontendMetrics
from interlock.metrics import CATALOG, Registry
from interlock.metrics.catalog import markdown
from interlock.metrics.http import metrics_route, serve_http

DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def families(text: str) -> dict[str, Metric]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_histogram_buckets_are_cumulative() -> None:
    r = Registry()
    h = r.histogram("interlock_time_to_first_token_seconds")
    for v, n in ((0.0005, 1), (0.003, 2), (100.0, 1)):
        h.observe(v, ("a",), count=n)
    samples = {
        (s.name, s.labels.get("le")): s.value
        for s in families(r.render())["interlock_time_to_first_token_seconds"].samples
    }
    assert samples[("interlock_time_to_first_token_seconds_bucket", "0.001")] == 1
    assert samples[("interlock_time_to_first_token_seconds_bucket", "0.005")] == 3
    assert samples[("interlock_time_to_first_token_seconds_bucket", "+Inf")] == 4
    assert samples[("interlock_time_to_first_token_seconds_count", None)] == 4
    assert samples[("interlock_time_to_first_token_seconds_sum", None)] == pytest.approx(
        0.0005 + 0.006 + 100.0
    )


def test_frontend_metrics_parse() -> None:
    m = FrontendMetrics()
    m.requests.inc(("chat", "200"))
    m.in_flight.inc()
    m.ttft.observe(0.01, ('we"ird\nmodel',))
    m.completion_tokens.inc(("m",), 16)
    parsed = families(m.render())
    assert parsed["interlock_http_requests"].type == "counter"
    assert parsed["interlock_requests_in_flight"].samples[0].value == 1
    ttft = parsed["interlock_time_to_first_token_seconds"]
    assert ttft.samples[0].labels["model"] == 'we"ird\nmodel'
    assert parsed["interlock_completion_tokens"].samples[0].value == 16
    assert parsed["process_open_fds"].samples[0].value > 0
    build = parsed["interlock_build_info"].samples[0]
    assert build.labels["component"] == "frontend" and build.value == 1


def test_only_catalogued_names_of_their_type() -> None:
    r = Registry()
    with pytest.raises(KeyError, match="not in the catalogue"):
        r.counter("interlock_made_up_total")
    with pytest.raises(TypeError, match="catalogued as a histogram"):
        r.counter("interlock_time_to_first_token_seconds")
    r.counter("interlock_completion_tokens_total")
    with pytest.raises(ValueError, match="registered twice"):
        r.counter("interlock_completion_tokens_total")


def test_groups_switch_families_off() -> None:
    m = FrontendMetrics()
    text = m.render(frozenset({"ttft"}))
    assert "interlock_time_to_first_token_seconds" in text
    assert "interlock_inter_token_latency_seconds" not in text
    assert "process_cpu_seconds_total" in text  # no group: always served


def test_included_registry_and_collectors() -> None:
    inner = Registry()
    inner.collect("interlock_router_queue_depth", lambda: [(("m",), 3)])
    outer = FrontendMetrics()
    outer.registry.include(inner)
    parsed = families(outer.render())
    assert parsed["interlock_router_queue_depth"].samples[0].value == 3
    assert "interlock_router_queue_depth" in outer.registry.names()


def test_docs_match_the_catalogue() -> None:
    assert DOCS.read_text() == markdown(), "run: python -m interlock.metrics.catalog > docs/metrics.md"


def test_catalogue_follows_prometheus_conventions() -> None:
    for spec in CATALOG.values():
        assert spec.name.startswith(("interlock_", "process_")), spec.name
        assert spec.kind in ("counter", "gauge", "histogram"), spec.name
        assert spec.name.endswith("_total") == (spec.kind == "counter"), spec.name
        assert spec.help.endswith("."), spec.name


def test_fleet_merge_labels_each_worker() -> None:
    own = FrontendMetrics()
    own.in_flight.inc()
    worker = Registry()
    worker.counter("interlock_engine_requests_total").inc(("stop",), 2)
    worker.histogram("interlock_engine_queue_time_seconds").observe(0.002)
    text = worker.render()
    fams: dict[str, list[str]] = {}
    order: list[str] = []
    _merge(own.render(), None, fams, order)
    _merge(text, "w1", fams, order)
    _merge(text, "w2", fams, order)
    parsed = families("\n".join(line for name in order for line in fams[name]) + "\n")
    done = parsed["interlock_engine_requests"].samples
    assert {(s.labels["worker"], s.labels["finish_reason"], s.value) for s in done} == {
        ("w1", "stop", 2),
        ("w2", "stop", 2),
    }
    queue = parsed["interlock_engine_queue_time_seconds"].samples
    assert {s.labels["worker"] for s in queue} == {"w1", "w2"}


def test_fleet_text_fetches_workers_and_names_the_silent() -> None:
    async def main() -> str:
        worker = Registry()
        worker.counter("interlock_engine_requests_total").inc(("length",))
        server = await serve_http({"/metrics": metrics_route(worker)})
        port = server.sockets[0].getsockname()[1]
        try:
            return await fleet_text("", [("w1", f"127.0.0.1:{port}"), ("gone", "127.0.0.1:9")], timeout_s=2.0)
        finally:
            server.close()

    text = asyncio.run(main())
    assert 'interlock_engine_requests_total{worker="w1",finish_reason="length"} 1' in text
    assert "# workers not answering: gone" in text
