"""The Prometheus registry renders text that Prometheus' own parser reads back exactly."""

from __future__ import annotations

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from interlock.frontend.metrics import FrontendMetrics, Histogram


def families(text: str) -> dict[str, Metric]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_histogram_buckets_are_cumulative() -> None:
    h = Histogram("t_seconds", "help", ("model",), buckets=(0.1, 1.0))
    h.observe(0.05, ("a",))
    h.observe(0.5, ("a",), count=2)
    h.observe(5.0, ("a",))
    samples = {
        (s.name, s.labels.get("le")): s.value
        for s in families("\n".join(h.render()) + "\n")["t_seconds"].samples
    }
    assert samples[("t_seconds_bucket", "0.1")] == 1
    assert samples[("t_seconds_bucket", "1.0")] == 3
    assert samples[("t_seconds_bucket", "+Inf")] == 4
    assert samples[("t_seconds_count", None)] == 4
    assert samples[("t_seconds_sum", None)] == 0.05 + 1.0 + 5.0


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
