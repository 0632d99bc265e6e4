"""The server's own figures for a bench run: parsing, deltas, the fallbacks, and the report."""

from __future__ import annotations

import asyncio

from interlock.bench.fake_server import FakeOpenAIServer, FakeTiming
from interlock.bench.server_metrics import (
    ServerFigures,
    by_label,
    figures,
    metrics_urls,
    parse,
    scrape,
    total,
)
from interlock.bench.stats import summarize
from interlock.bench.table import compare_table, server_table

from .conftest import with_server

BEFORE = """\
# HELP interlock_requests_total Generation requests ended.
# TYPE interlock_requests_total counter
interlock_requests_total{model="m",finish_reason="stop"} 3
interlock_requests_total{model="m",finish_reason="length"} 1
interlock_prompt_tokens_total{model="m"} 100
interlock_prompt_tokens_cached_total{model="m"} 10
interlock_router_migrations_total 1
# TYPE interlock_engine_queue_time_seconds histogram
interlock_engine_queue_time_seconds_bucket{worker="w1",le="+Inf"} 2
interlock_engine_queue_time_seconds_sum{worker="w1"} 0.5
interlock_engine_queue_time_seconds_count{worker="w1"} 2
interlock_engine_queue_time_seconds_sum{worker="w2"} 0.0
interlock_engine_queue_time_seconds_count{worker="w2"} 0
"""
AFTER = """\
interlock_requests_total{model="m",finish_reason="stop"} 7
interlock_requests_total{model="m",finish_reason="length"} 1
interlock_requests_total{model="m",finish_reason="error"} 2
interlock_prompt_tokens_total{model="m"} 500
interlock_prompt_tokens_cached_total{model="m"} 110
interlock_router_migrations_total 4
interlock_engine_queue_time_seconds_sum{worker="w1"} 1.5
interlock_engine_queue_time_seconds_count{worker="w1"} 6
interlock_engine_queue_time_seconds_sum{worker="w2"} 1.0
interlock_engine_queue_time_seconds_count{worker="w2"} 4
interlock_engine_preemptions_total{worker="w1"} 2 1700000000000
"""


def test_parse_reads_labels_escapes_special_values_and_skips_junk() -> None:
    samples = parse(
        'a_total{x="q\\"uote",y="back\\\\slash, comma"} 2\n'
        "b +Inf\n"
        "c NaN\n"
        "d{} 4 123\n"
        'vllm:num_preemptions_total{engine="0"} 5\n'
        "not a sample\n"
        'e{broken="} 1\n'
        "\n# a comment\n"
    )
    assert samples[("a_total", (("x", 'q"uote'), ("y", "back\\slash, comma")))] == 2
    assert samples[("b", ())] == float("inf")
    assert samples[("d", ())] == 4
    assert samples[("vllm:num_preemptions_total", (("engine", "0"),))] == 5
    assert ("c", ()) in samples
    assert {name for name, _ in samples} == {"a_total", "b", "c", "d", "vllm:num_preemptions_total"}


def test_total_and_by_label_sum_across_labels() -> None:
    samples = parse(AFTER)
    assert total(samples, "interlock_requests_total") == 10
    assert total(samples, "interlock_requests_total", finish_reason="stop") == 7
    assert total(samples, "absent_total") is None
    assert by_label(samples, "interlock_requests_total", "finish_reason") == {
        "stop": 7,
        "length": 1,
        "error": 2,
    }


def test_figures_are_deltas_across_the_run() -> None:
    f = figures(parse(BEFORE), parse(AFTER))
    assert f.queue_time_mean_s == 2.0 / 8  # (1.5 + 1.0 - 0.5) / (6 + 4 - 2)
    assert f.prefill_time_mean_s is None
    assert f.cache_hit_rate == 100 / 400
    assert f.migrations == 3
    assert f.preemptions == 2  # absent before: counted from zero
    assert f.requests_by_finish_reason == {"error": 2, "stop": 4}


def test_figures_fall_back_to_vllm_names_and_to_none() -> None:
    before = parse(
        "vllm:request_queue_time_seconds_sum 1\nvllm:request_queue_time_seconds_count 1\n"
        'vllm:request_success_total{finished_reason="stop"} 1\n'
        "vllm:prefix_cache_hits_total 0\nvllm:prefix_cache_queries_total 0\n"
    )
    after = parse(
        "vllm:request_queue_time_seconds_sum 3\nvllm:request_queue_time_seconds_count 5\n"
        'vllm:request_success_total{finished_reason="stop"} 4\n'
        "vllm:prefix_cache_hits_total 30\nvllm:prefix_cache_queries_total 120\n"
    )
    f = figures(before, after)
    assert f.queue_time_mean_s == 0.5
    assert f.cache_hit_rate == 0.25
    assert f.requests_by_finish_reason == {"stop": 3}
    assert f.migrations is None and f.preemptions is None
    assert figures({}, {}) == ServerFigures()


def test_no_requests_means_no_mean_rather_than_a_division_by_zero() -> None:
    assert figures(parse(AFTER), parse(AFTER)).queue_time_mean_s is None
    assert figures(parse(AFTER), parse(AFTER)).cache_hit_rate is None


def test_figures_survive_the_results_file_round_trip() -> None:
    f = figures(parse(BEFORE), parse(AFTER))
    assert ServerFigures.from_json({**f.to_json(), "added_later": 1}) == f


def test_metrics_urls_drop_the_api_prefix() -> None:
    assert metrics_urls("http://h:8000/v1/") == ("http://h:8000/metrics?scope=fleet", "http://h:8000/metrics")


def test_tables_show_figures_and_say_what_is_not_available() -> None:
    f = figures(parse(BEFORE), parse(AFTER))
    text = server_table(f)
    assert "server queue time (mean)    250.0 ms" in text
    assert "server prefill time (mean)  not available" in text
    assert "server cache hit rate       25.0%" in text
    assert "server requests by finish   error=2, stop=4" in text
    assert server_table(None) == "server /metrics  not available"
    s = summarize([], 1.0)
    both = compare_table(["a", "b"], [s, s], [f, None])
    assert "server migrations" in both and "not available" in both
    assert "server migrations" not in compare_table(["a"], [s])


def test_scrape_reads_the_fake_servers_fleet_metrics_and_tolerates_none() -> None:
    async def body(server: FakeOpenAIServer) -> tuple[object, object]:
        with_metrics = await scrape(server.url + "/v1")
        server.metrics = False
        return with_metrics, await scrape(server.url)

    samples, none = with_server(FakeTiming(), body)
    assert isinstance(samples, dict)
    assert total(samples, "interlock_engine_prefill_time_seconds_count", worker="fake-0") is not None
    assert none is None
    assert asyncio.run(scrape("http://127.0.0.1:9", timeout_s=2)) is None
