"""Plain-text tables for the terminal: one run's summary and the server's own figures for it, or
several runs side by side."""

from __future__ import annotations

import math
from collections.abc import Sequence

from interlock.bench.server_metrics import ServerFigures
from interlock.bench.stats import Dist, Summary

LATENCIES = (
    ("TTFT (ms)", "ttft_ms"),
    ("ITL (ms)", "itl_ms"),
    ("inter-chunk (ms)", "icl_ms"),
    ("E2E (ms)", "e2e_ms"),
)
TOKENS = (("input tokens", "input_tokens"), ("output tokens", "output_tokens"))
STATS = ("mean", "p50", "p90", "p99", "max")


def _fmt(x: float | None, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:,.{digits}f}"


def _grid(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for k, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)]
        lines.append("  ".join(cells))
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _errors(s: Summary) -> str:
    return ", ".join(f"{k}={v}" for k, v in s.errors.items()) or "none"


def summary_table(s: Summary, title: str = "") -> str:
    rows: list[list[str]] = [["metric", *STATS]]
    for name, attr in LATENCIES + TOKENS:
        d: Dist = getattr(s, attr)
        rows.append([name, *(_fmt(getattr(d, st)) for st in STATS)])
    lines = [title] if title else []
    lines += [
        _grid(rows),
        f"requests {s.ok}/{s.requests} ok in {s.duration_s:.2f} s; errors: {_errors(s)}",
        f"throughput {s.request_throughput:.2f} req/s, {s.output_throughput:.1f} output tok/s, "
        f"{s.total_token_throughput:.1f} total tok/s",
    ]
    if s.goodput is not None:
        lines.append(
            f"goodput {s.goodput:.2f} req/s ({_fmt((s.good_fraction or 0) * 100)}% of requests met the targets)"
        )
    if s.cached_fraction is not None:
        lines.append(f"prompt tokens the server reported cached: {s.cached_fraction * 100:.1f}%")
    if s.stream_usage_mismatch:
        lines.append(
            f"note: {s.stream_usage_mismatch} requests streamed a chunk count != usage tokens (multi-token chunks)"
        )
    return "\n".join(lines)


NOT_AVAILABLE = "not available"


def _ms(seconds: float | None) -> str:
    return NOT_AVAILABLE if seconds is None else f"{seconds * 1000:,.1f} ms"


def _count(x: float | None) -> str:
    return NOT_AVAILABLE if x is None else f"{x:,.0f}"


def _finished(f: ServerFigures) -> str:
    return ", ".join(f"{k}={v:,.0f}" for k, v in f.requests_by_finish_reason.items()) or NOT_AVAILABLE


def server_rows(f: ServerFigures | None) -> list[tuple[str, str]]:
    """The server's own figures for a run, each "not available" where it exports none."""
    if f is None:
        return [("server /metrics", NOT_AVAILABLE)]
    hit = NOT_AVAILABLE if f.cache_hit_rate is None else f"{f.cache_hit_rate * 100:.1f}%"
    return [
        ("server queue time (mean)", _ms(f.queue_time_mean_s)),
        ("server prefill time (mean)", _ms(f.prefill_time_mean_s)),
        ("server cache hit rate", hit),
        ("server migrations", _count(f.migrations)),
        ("server preemptions", _count(f.preemptions)),
        ("server requests by finish", _finished(f)),
    ]


def server_table(f: ServerFigures | None) -> str:
    rows = server_rows(f)
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name.ljust(width)}  {value}" for name, value in rows)


def compare_table(
    labels: Sequence[str], summaries: Sequence[Summary], server: Sequence[ServerFigures | None] = ()
) -> str:
    rows: list[list[str]] = [["metric", *labels]]

    def add(name: str, values: Sequence[str]) -> None:
        rows.append([name, *values])

    add("requests ok/total", [f"{s.ok}/{s.requests}" for s in summaries])
    add("errors", [_errors(s) for s in summaries])
    add("duration (s)", [_fmt(s.duration_s, 2) for s in summaries])
    add("req/s", [_fmt(s.request_throughput, 2) for s in summaries])
    add("output tok/s", [_fmt(s.output_throughput) for s in summaries])
    add("goodput (req/s)", [_fmt(s.goodput, 2) for s in summaries])
    for name, attr in LATENCIES:
        for st in ("mean", "p50", "p90", "p99"):
            add(f"{name.split(' (')[0]} {st} (ms)", [_fmt(getattr(getattr(s, attr), st)) for s in summaries])
    add("output tokens mean", [_fmt(s.output_tokens.mean) for s in summaries])
    add(
        "cached prompt %",
        [_fmt(None if s.cached_fraction is None else s.cached_fraction * 100) for s in summaries],
    )
    if any(f is not None for f in server):
        per_run = [dict(server_rows(f)) for f in server]
        for name, _ in server_rows(ServerFigures()):
            add(name, [r.get(name, NOT_AVAILABLE) for r in per_run])
    return _grid(rows)
