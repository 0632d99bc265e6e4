"""One Prometheus registry for every component: counters, gauges and histograms kept here, and
collectors that read figures kept elsewhere (a router's counters, workers' load reports) when
``/metrics`` is scraped. Text exposition format 0.0.4.

Hand-written rather than ``prometheus_client``: an observation on the request path costs a dict
lookup and an add (``benchmarks/metrics_cost.py``: 3-10x cheaper than ``prometheus_client``'s
labelled observation, docs/design.md); rendering happens only when scraped.

Every metric is declared in the catalogue (``interlock.metrics.catalog``): a registry makes a
metric by name only, from the catalogue's type, labels and help, so nothing exported is
uncatalogued and ``docs/metrics.md`` is the list of what can be scraped.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from interlock.metrics.catalog import CATALOG, Spec

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Labels = tuple[str, ...]
M = TypeVar("M", bound="_Metric")
Samples = Iterable[tuple[Labels, float]]
"""A collector's answer: ``(label values in the spec's order, value)`` per series."""


class _Metric:
    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.name = spec.name

    def samples(self) -> list[str]:
        raise NotImplementedError


class Counter(_Metric):
    def __init__(self, spec: Spec) -> None:
        super().__init__(spec)
        self.values: dict[Labels, float] = {}

    def inc(self, labels: Labels = (), amount: float = 1.0) -> None:
        self.values[labels] = self.values.get(labels, 0.0) + amount

    def get(self, labels: Labels = ()) -> float:
        return self.values.get(labels, 0.0)

    def samples(self) -> list[str]:
        return [_line(self.spec, self.name, k, v) for k, v in self.values.items()]


class Gauge(Counter):
    def dec(self, labels: Labels = (), amount: float = 1.0) -> None:
        self.values[labels] = self.values.get(labels, 0.0) - amount

    def set(self, value: float, labels: Labels = ()) -> None:
        self.values[labels] = value


class Histogram(_Metric):
    def __init__(self, spec: Spec) -> None:
        super().__init__(spec)
        self.buckets = spec.buckets
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

    def count(self, labels: Labels = ()) -> int:
        return sum(self.counts.get(labels, ()))

    def samples(self) -> list[str]:
        lines: list[str] = []
        spec, name = self.spec, self.name
        for labels, counts in self.counts.items():
            running = 0
            for bound, n in zip((*self.buckets, float("inf")), counts, strict=True):
                running += n
                le = "+Inf" if bound == float("inf") else repr(float(bound))
                lines.append(_line(spec, f"{name}_bucket", labels, running, f'le="{le}"'))
            lines.append(_line(spec, f"{name}_sum", labels, self.sums[labels]))
            lines.append(_line(spec, f"{name}_count", labels, running))
        return lines


class _Collected(_Metric):
    def __init__(self, spec: Spec, collect: Callable[[], Samples]) -> None:
        super().__init__(spec)
        self.collect = collect

    def samples(self) -> list[str]:
        return [_line(self.spec, self.name, k, v) for k, v in self.collect()]


class Registry:
    """The metrics one process serves. Made by name from the catalogue; a name registered twice
    is a bug (refused). ``include`` adds another registry's metrics to what this one renders (a
    frontend's router service, for instance)."""

    def __init__(self) -> None:
        self._metrics: dict[str, _Metric] = {}
        self._included: list[Registry] = []

    def counter(self, name: str) -> Counter:
        return self._add(Counter(_spec(name, "counter")))

    def gauge(self, name: str) -> Gauge:
        return self._add(Gauge(_spec(name, "gauge")))

    def histogram(self, name: str) -> Histogram:
        return self._add(Histogram(_spec(name, "histogram")))

    def collect(self, name: str, fn: Callable[[], Samples]) -> None:
        """Serve ``name`` (a counter or gauge) from ``fn``, called at each scrape."""
        spec = CATALOG.get(name)
        if spec is None or spec.kind == "histogram":
            raise KeyError(f"{name}: not a catalogued counter or gauge (interlock.metrics.catalog)")
        self._add(_Collected(spec, fn))

    def include(self, other: Registry) -> None:
        if other is not self and other not in self._included:
            self._included.append(other)

    def names(self) -> list[str]:
        """Every metric this registry renders, included ones too, in render order."""
        out = list(self._metrics)
        for other in self._included:
            out += [n for n in other.names() if n not in out]
        return out

    def render(self, groups: frozenset[str] | None = None) -> str:
        """Prometheus text of every metric (each family once, with its HELP and TYPE even before
        its first sample); ``groups``: only metrics of no group or of one of these."""
        lines: list[str] = []
        for metric in self._all():
            spec = metric.spec
            if groups is not None and spec.group and spec.group not in groups:
                continue
            lines += [f"# HELP {spec.name} {spec.help}", f"# TYPE {spec.name} {spec.kind}"]
            lines += metric.samples()
        return "\n".join(lines) + "\n"

    def _all(self) -> list[_Metric]:
        seen: dict[str, _Metric] = dict(self._metrics)
        for other in self._included:
            for m in other._all():
                seen.setdefault(m.name, m)
        return list(seen.values())

    def _add(self, metric: M) -> M:
        if metric.name in self._metrics:
            raise ValueError(f"{metric.name}: registered twice")
        self._metrics[metric.name] = metric
        return metric


def _spec(name: str, kind: str) -> Spec:
    spec = CATALOG.get(name)
    if spec is None:
        raise KeyError(f"{name}: not in the catalogue (interlock.metrics.catalog)")
    if spec.kind != kind:
        raise TypeError(f"{name}: catalogued as a {spec.kind}, not a {kind}")
    return spec


def _line(spec: Spec, name: str, values: Sequence[str], value: float, extra: str = "") -> str:
    parts = [f'{k}="{escape_label(str(v))}"' for k, v in zip(spec.labels, values, strict=True)]
    if extra:
        parts.append(extra)
    labels = "{" + ",".join(parts) + "}" if parts else ""
    return f"{name}{labels} {sample_value(value)}"


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def sample_value(value: float) -> str:
    """A sample's value: integral ones as integers (counts read as counts), others as floats."""
    if isinstance(value, int):
        return str(value)
    if value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))
