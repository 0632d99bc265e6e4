"""The dashboard's figures: the frontend's counters read once a second into a ring of samples,
and rates and means over each second from two neighbouring samples.

The counters and histograms only ever grow, so what happened in one second is the difference of
two readings: requests and tokens per second are differences over the time between them, and
the mean time to first token (or between tokens) is the difference of the histogram's sums over
the difference of its counts (no observation in that second: no point, not zero). A counter that
went down (a registry replaced) gives 0 for that second rather than a negative rate.

Everything here is pure but ``read``, which takes a reading of a ``FrontendMetrics``; the HTTP
side (page, event stream, sampling task) is ``dashboard_http``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from interlock.frontend.metrics import FrontendMetrics
from interlock.metrics import Counter, Histogram
from interlock.metrics.events import Event

HISTORY = 300
"""Samples kept: five minutes at one a second."""
EVENTS_SHOWN = 50


@dataclass(frozen=True, slots=True)
class Sample:
    """The frontend's running totals at wall-clock time ``at``, every model summed."""

    at: float
    requests: float
    errors: float
    in_flight: float
    prompt_tokens: float
    completion_tokens: float
    cached_tokens: float
    ttft_sum: float
    ttft_count: float
    itl_sum: float
    itl_count: float


@dataclass(frozen=True, slots=True)
class Point:
    """What happened between two samples: rates per second, means in seconds (None: nothing
    observed in the interval)."""

    at: float
    requests_per_s: float
    tokens_per_s: float
    prompt_tokens_per_s: float
    ttft_s: float | None
    itl_s: float | None


def read(metrics: FrontendMetrics, at: float) -> Sample:
    return Sample(
        at=at,
        requests=_total(metrics.finished),
        errors=sum(v for labels, v in metrics.finished.values.items() if labels[-1:] == ("error",)),
        in_flight=_total(metrics.in_flight),
        prompt_tokens=_total(metrics.prompt_tokens),
        completion_tokens=_total(metrics.completion_tokens),
        cached_tokens=_total(metrics.cached_tokens),
        ttft_sum=sum(metrics.ttft.sums.values()),
        ttft_count=_count(metrics.ttft),
        itl_sum=sum(metrics.itl.sums.values()),
        itl_count=_count(metrics.itl),
    )


def difference(prev: Sample, cur: Sample) -> Point:
    """The rates and means between two samples (``prev`` the earlier)."""
    dt = cur.at - prev.at

    def rate(a: float, b: float) -> float:
        return max(0.0, b - a) / dt if dt > 0 else 0.0

    return Point(
        at=cur.at,
        requests_per_s=rate(prev.requests, cur.requests),
        tokens_per_s=rate(prev.completion_tokens, cur.completion_tokens),
        prompt_tokens_per_s=rate(prev.prompt_tokens, cur.prompt_tokens),
        ttft_s=_mean(cur.ttft_sum - prev.ttft_sum, cur.ttft_count - prev.ttft_count),
        itl_s=_mean(cur.itl_sum - prev.itl_sum, cur.itl_count - prev.itl_count),
    )


class History:
    """The last sample, and the last ``capacity`` points (each between a sample and the one
    before it)."""

    def __init__(self, capacity: int = HISTORY) -> None:
        self.last: Sample | None = None
        self.points: deque[Point] = deque(maxlen=capacity)

    def add(self, sample: Sample) -> Point | None:
        point = difference(self.last, sample) if self.last is not None else None
        if point is not None:
            self.points.append(point)
        self.last = sample
        return point


def series(points: Sequence[Point]) -> dict[str, list[float | None]]:
    """Columns for the page's charts (milliseconds for the latencies)."""
    return {
        "time": [p.at for p in points],
        "requests_per_s": [round(p.requests_per_s, 3) for p in points],
        "tokens_per_s": [round(p.tokens_per_s, 2) for p in points],
        "prompt_tokens_per_s": [round(p.prompt_tokens_per_s, 2) for p in points],
        "ttft_ms": [None if p.ttft_s is None else round(p.ttft_s * 1e3, 2) for p in points],
        "itl_ms": [None if p.itl_s is None else round(p.itl_s * 1e3, 2) for p in points],
    }


def snapshot(
    history: History,
    cluster: Mapping[str, object] | None,
    events: Iterable[Event],
    now: float,
) -> dict[str, object]:
    """One message of the event stream: totals, the charts' columns, the cluster's picture (None:
    the backend cannot draw one) and the newest events, oldest first."""
    last = history.last
    totals: dict[str, float] = {}
    if last is not None:
        totals = {
            "requests": last.requests,
            "errors": last.errors,
            "in_flight": last.in_flight,
            "prompt_tokens": last.prompt_tokens,
            "completion_tokens": last.completion_tokens,
            "cached_tokens": last.cached_tokens,
            "cache_hit_rate": last.cached_tokens / last.prompt_tokens if last.prompt_tokens else 0.0,
        }
    return {
        "time": now,
        "totals": totals,
        "series": series(history.points),
        "cluster": dict(cluster) if cluster is not None else None,
        "events": [
            {"time": e.time, "kind": e.kind, "subject": e.subject, "reason": e.reason} for e in events
        ],
    }


def _total(counter: Counter) -> float:
    return sum(counter.values.values())


def _count(histogram: Histogram) -> float:
    return float(sum(sum(c) for c in histogram.counts.values()))


def _mean(total: float, count: float) -> float | None:
    return total / count if count > 0 else None
