"""A minimal Prometheus registry: counters, gauges and histograms, text exposition format 0.0.4.

Hand-written rather than prometheus_client because observation sits on the per-token path and
must cost a dict lookup and an add; rendering happens only when /metrics is scraped.
Names follow Prometheus conventions: ``interlock_`` prefix, base units (seconds), ``_total`` on
counters.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)

Labels = tuple[str, ...]

FAMILIES = {
    "interlock_http_requests_total": "requests",
    "interlock_requests_in_flight": "requests",
    "interlock_http_shed_total": "requests",
    "interlock_time_to_first_token_seconds": "ttft",
    "interlock_inter_token_latency_seconds": "itl",
    "interlock_request_duration_seconds": "e2e",
    "interlock_prompt_tokens_total": "tokens",
    "interlock_completion_tokens_total": "tokens",
    "interlock_prompt_tokens_cached_total": "kv_cache_miss",
    "interlock_kv_cache_miss_tokens_total": "kv_cache_miss",
    "interlock_router_predicted_cached_tokens_total": "kv_cache_miss",
    "interlock_worker_kv_blocks_used": "kv",
    "interlock_worker_kv_blocks_total": "kv",
    "interlock_worker_running_requests": "queue_depth",
    "interlock_worker_waiting_requests": "queue_depth",
    "interlock_router_queued_total": "queue_depth",
    "interlock_worker_busy_seconds_total": "gpu_utilization",
}
"""Which family each metric belongs to (a deployment's ``metrics`` section switches families
on and off); metrics not listed are always shown."""
_SUFFIXES = ("_bucket", "_sum", "_count")


def family_of(line: str) -> str | None:
    """The family of one line of Prometheus text (its metric's), or None."""
    if line.startswith("# "):
        parts = line.split(" ", 3)
        name = parts[2] if len(parts) > 2 else ""
    else:
        name = line.split("{", 1)[0].split(" ", 1)[0]
    family = FAMILIES.get(name)
    if family is None:
        for suffix in _SUFFIXES:
            if name.endswith(suffix):
                return FAMILIES.get(name[: -len(suffix)])
    return family


def keep_families(text: str, families: frozenset[str] | None) -> str:
    """``text`` without the lines of metrics whose family is not in ``families`` (None: all)."""
    if families is None:
        return text
    lines = [line for line in text.split("\n") if (f := family_of(line)) is None or f in families]
    return "\n".join(lines)


class _Metric:
    kind = ""

    def __init__(self, name: str, help_text: str, labelnames: Sequence[str] = ()) -> None:
        self.name = name
        self.help = help_text
        self.labelnames = tuple(labelnames)

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]

    def render(self) -> list[str]:
        raise NotImplementedError

    def _labels(self, values: Labels, extra: str = "") -> str:
        parts = [f'{k}="{_escape(v)}"' for k, v in zip(self.labelnames, values, strict=True)]
        if extra:
            parts.append(extra)
        return "{" + ",".join(parts) + "}" if parts else ""


class Counter(_Metric):
    kind = "counter"

    def __init__(self, name: str, help_text: str, labelnames: Sequence[str] = ()) -> None:
        super().__init__(name, help_text, labelnames)
        self.values: dict[Labels, float] = {}

    def inc(self, labels: Labels = (), amount: float = 1.0) -> None:
        self.values[labels] = self.values.get(labels, 0.0) + amount

    def render(self) -> list[str]:
        return self.header() + [f"{self.name}{self._labels(k)} {_num(v)}" for k, v in self.values.items()]


class Gauge(Counter):
    kind = "gauge"

    def dec(self, labels: Labels = (), amount: float = 1.0) -> None:
        self.values[labels] = self.values.get(labels, 0.0) - amount

    def set(self, value: float, labels: Labels = ()) -> None:
        self.values[labels] = value


class Histogram(_Metric):
    kind = "histogram"

    def __init__(
        self,
        name: str,
        help_text: str,
        labelnames: Sequence[str] = (),
        buckets: Sequence[float] = LATENCY_BUCKETS,
    ) -> None:
        super().__init__(name, help_text, labelnames)
        self.buckets = tuple(sorted(buckets))
        self.counts: dict[Labels, list[int]] = {}
        self.sums: dict[Labels, float] = {}

    def observe(self, value: float, labels: Labels = (), count: int = 1) -> None:
        """Record ``count`` observations of ``value`` (e.g. one gap shared by a chunk's tokens)."""
        counts = self.counts.get(labels)
        if counts is None:
            counts = self.counts[labels] = [0] * (len(self.buckets) + 1)
            self.sums[labels] = 0.0
        counts[bisect_left(self.buckets, value)] += count
        self.sums[labels] += value * count

    def render(self) -> list[str]:
        lines = self.header()
        for labels, counts in self.counts.items():
            running = 0
            for bound, n in zip((*self.buckets, float("inf")), counts, strict=True):
                running += n
                le = "+Inf" if bound == float("inf") else _num(bound)
                le_label = f'le="{le}"'
                lines.append(f"{self.name}_bucket{self._labels(labels, le_label)} {running}")
            lines.append(f"{self.name}_sum{self._labels(labels)} {_num(self.sums[labels])}")
            lines.append(f"{self.name}_count{self._labels(labels)} {running}")
        return lines


class FrontendMetrics:
    """The frontend's figures, labelled by model and endpoint."""

    def __init__(self) -> None:
        self.requests = Counter(
            "interlock_http_requests_total",
            "HTTP requests by endpoint and status code.",
            ("endpoint", "status"),
        )
        self.in_flight = Gauge("interlock_requests_in_flight", "Generation requests being served now.")
        self.shed = Counter(
            "interlock_http_shed_total",
            "Connections closed or refused, and requests cut, to keep the frontend fair and its "
            "memory bounded, by reason.",
            ("reason",),
        )
        self.ttft = Histogram(
            "interlock_time_to_first_token_seconds", "Time from request arrival to first token.", ("model",)
        )
        self.itl = Histogram(
            "interlock_inter_token_latency_seconds",
            "Time between consecutive output tokens.",
            ("model",),
            ITL_BUCKETS,
        )
        self.e2e = Histogram(
            "interlock_request_duration_seconds", "Time from request arrival to the last token.", ("model",)
        )
        self.prompt_tokens = Counter("interlock_prompt_tokens_total", "Prompt tokens processed.", ("model",))
        self.cached_tokens = Counter(
            "interlock_prompt_tokens_cached_total", "Prompt tokens served from a prefix cache.", ("model",)
        )
        self.cache_miss_tokens = Counter(
            "interlock_kv_cache_miss_tokens_total",
            "Prompt tokens computed because no prefix cache held them (prompt less cached).",
            ("model",),
        )
        self.completion_tokens = Counter(
            "interlock_completion_tokens_total", "Completion tokens generated.", ("model",)
        )

    def render(self) -> str:
        """Every metric above, in the order it is made (the attributes are the registry)."""
        lines: list[str] = []
        for metric in vars(self).values():
            if isinstance(metric, _Metric):
                lines.extend(metric.render())
        return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(value: float) -> str:
    return repr(float(value))
