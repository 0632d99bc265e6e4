import math

import pytest

from interlock.bench.client import RequestRecord
from interlock.bench.stats import Dist, Targets, meets, request_itl_s, summarize, throughput_series


def rec(i: int, ttft: float, e2e: float, tokens: int, error: str | None = None) -> RequestRecord:
    gap = (e2e - ttft) / max(tokens - 1, 1)
    return RequestRecord(
        index=i,
        start_s=float(i),
        ttft_s=ttft,
        e2e_s=e2e,
        error=error,
        chunk_times_s=[round(ttft + k * gap, 6) for k in range(tokens)],
        output_tokens_stream=tokens,
        output_tokens_usage=tokens,
        input_tokens=100,
    )


RECORDS = [
    rec(0, 0.100, 0.100 + 9 * 0.020, 10),  # ttft 100 ms, itl 20 ms
    rec(1, 0.300, 0.300 + 9 * 0.020, 10),  # ttft 300 ms
    rec(2, 0.100, 0.100 + 9 * 0.060, 10),  # itl 60 ms
    rec(3, 0.050, 0.050, 1),  # one token: no ITL
    RequestRecord(index=4, start_s=4.0, error="http_503"),
]


def test_itl_is_per_request_mean_after_the_first_token() -> None:
    assert request_itl_s(RECORDS[0]) == pytest.approx(0.020)
    assert request_itl_s(RECORDS[3]) is None and request_itl_s(RECORDS[4]) is None


def test_goodput_counts_requests_meeting_all_targets() -> None:
    targets = Targets(ttft_ms=200, itl_ms=50)
    assert [meets(r, targets) for r in RECORDS] == [True, False, False, True, False]
    s = summarize(RECORDS, duration_s=2.0, targets=targets)
    assert s.goodput == pytest.approx(1.0) and s.good_fraction == pytest.approx(0.4)
    assert summarize(RECORDS, 2.0, Targets(e2e_ms=300)).goodput == pytest.approx(1.0)  # records 0 and 3
    assert summarize(RECORDS, 2.0).goodput is None


def test_summary_numbers() -> None:
    s = summarize(RECORDS, duration_s=2.0)
    assert (s.requests, s.ok, s.errors) == (5, 4, {"http_503": 1})
    assert s.output_throughput == pytest.approx(31 / 2.0) and s.request_throughput == pytest.approx(2.0)
    assert s.ttft_ms.p50 == pytest.approx(100.0) and s.ttft_ms.max == pytest.approx(300.0)
    assert s.itl_ms.count == 3 and s.itl_ms.mean == pytest.approx((20 + 20 + 60) / 3)
    assert s.icl_ms.count == 27 and s.stream_usage_mismatch == 0


def test_dist_percentiles_and_empty() -> None:
    d = Dist.of([float(x) for x in range(1, 101)])
    assert (d.p50, d.p90, d.p99, d.max) == pytest.approx((50.5, 90.1, 99.01, 100.0))
    assert Dist.of([]).count == 0 and math.isnan(Dist.of([]).p50)


def test_throughput_series_integrates_to_total_tokens() -> None:
    xs, ys = throughput_series(RECORDS, duration_s=5.0, bins=10)
    width = xs[1] - xs[0]
    assert sum(y * width for y in ys) == pytest.approx(31)


def test_cached_fraction_from_usage() -> None:
    a, b = rec(0, 0.1, 0.2, 5), rec(1, 0.1, 0.2, 5)
    a.prompt_tokens_usage, a.cached_tokens_usage = 100, 64
    b.prompt_tokens_usage, b.cached_tokens_usage = 300, 0
    assert summarize([a, b], 1.0).cached_fraction == pytest.approx(0.16)
    assert summarize(RECORDS, 1.0).cached_fraction is None
