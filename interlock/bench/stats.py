"""Summary statistics of a run (pure functions over request records).

Definitions, kept the same as AIPerf's and vLLM's benchmark so numbers compare:

* **TTFT**: first content chunk time since send; successful requests only.
* **ITL** (per request): ``(e2e - ttft) / (output_tokens - 1)``, the mean gap between tokens
  after the first, with ``output_tokens`` from the usage chunk when the server sent one. This
  is robust to servers that pack several tokens into a chunk. Requests with one token have none.
* **inter-chunk latency (ICL)**: every gap between consecutive content chunks, pooled over
  requests. With one token per chunk it is the per-token ITL distribution.
* **throughput**: output tokens of successful requests / run duration (first send to last end).
* **goodput**: successful requests per second whose TTFT, ITL and end-to-end latency all meet
  the targets given (DistServe's definition); unset targets always pass.

Percentiles use numpy's linear interpolation (as AIPerf does).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from interlock.bench.client import RequestRecord

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class Targets:
    """Goodput targets in milliseconds; ``None`` means no target on that metric."""

    ttft_ms: float | None = None
    itl_ms: float | None = None
    e2e_ms: float | None = None

    @property
    def any(self) -> bool:
        return any(v is not None for v in (self.ttft_ms, self.itl_ms, self.e2e_ms))


@dataclass(frozen=True)
class Dist:
    count: int
    mean: float
    p50: float
    p90: float
    p99: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Dist:
        if not values:
            nan = math.nan
            return cls(0, nan, nan, nan, nan, nan)
        arr = np.asarray(values, dtype=float)
        p50, p90, p99 = np.percentile(arr, PERCENTILES)
        return cls(len(arr), float(arr.mean()), float(p50), float(p90), float(p99), float(arr.max()))


def request_itl_s(r: RequestRecord) -> float | None:
    if not r.ok or r.ttft_s is None or r.e2e_s is None or r.output_tokens < 2:
        return None
    return (r.e2e_s - r.ttft_s) / (r.output_tokens - 1)


def chunk_gaps_s(r: RequestRecord) -> list[float]:
    times = r.chunk_times_s
    return [b - a for a, b in zip(times, times[1:], strict=False)] if r.ok else []


def meets(r: RequestRecord, targets: Targets) -> bool:
    if not r.ok or r.ttft_s is None or r.e2e_s is None:
        return False
    itl = request_itl_s(r)
    checks = (
        (targets.ttft_ms, r.ttft_s),
        (targets.itl_ms, itl if itl is not None else 0.0),
        (targets.e2e_ms, r.e2e_s),
    )
    return all(target is None or value * 1000 <= target for target, value in checks)


@dataclass(frozen=True)
class Summary:
    requests: int
    ok: int
    errors: dict[str, int]
    duration_s: float
    request_throughput: float
    output_throughput: float
    """Output tokens per second."""
    total_token_throughput: float
    """Input plus output tokens per second."""
    goodput: float | None
    """Requests per second meeting the targets, or None without targets."""
    good_fraction: float | None
    ttft_ms: Dist
    itl_ms: Dist
    icl_ms: Dist
    e2e_ms: Dist
    input_tokens: Dist
    output_tokens: Dist
    stream_usage_mismatch: int
    """Successful requests whose chunk count differs from the usage count (multi-token chunks)."""
    cached_fraction: float | None = None
    """Share of prompt tokens the server reported as cached (None when it reports nothing)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def summarize(records: Sequence[RequestRecord], duration_s: float, targets: Targets | None = None) -> Summary:
    ok = [r for r in records if r.ok]
    ms = 1000.0
    itls = [v for r in ok if (v := request_itl_s(r)) is not None]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens_usage or r.input_tokens for r in ok)
    good = sum(meets(r, targets) for r in ok) if targets and targets.any else None
    return Summary(
        requests=len(records),
        ok=len(ok),
        errors=dict(sorted(Counter(r.error for r in records if r.error).items())),
        duration_s=duration_s,
        request_throughput=len(ok) / duration_s,
        output_throughput=out_tokens / duration_s,
        total_token_throughput=(in_tokens + out_tokens) / duration_s,
        goodput=None if good is None else good / duration_s,
        good_fraction=None if good is None else good / max(len(records), 1),
        ttft_ms=Dist.of([r.ttft_s * ms for r in ok if r.ttft_s is not None]),
        itl_ms=Dist.of([v * ms for v in itls]),
        icl_ms=Dist.of([g * ms for r in ok for g in chunk_gaps_s(r)]),
        e2e_ms=Dist.of([r.e2e_s * ms for r in ok if r.e2e_s is not None]),
        input_tokens=Dist.of([r.prompt_tokens_usage or r.input_tokens for r in ok]),
        output_tokens=Dist.of([r.output_tokens for r in ok]),
        stream_usage_mismatch=sum(
            r.output_tokens_usage is not None and r.output_tokens_usage != r.output_tokens_stream for r in ok
        ),
        cached_fraction=_cached_fraction(ok),
    )


def _cached_fraction(ok: Sequence[RequestRecord]) -> float | None:
    reported = [r for r in ok if r.cached_tokens_usage is not None and r.prompt_tokens_usage]
    if not reported:
        return None
    return sum(r.cached_tokens_usage or 0 for r in reported) / sum(
        r.prompt_tokens_usage or 0 for r in reported
    )


def throughput_series(
    records: Sequence[RequestRecord], duration_s: float, bins: int = 50
) -> tuple[list[float], list[float]]:
    """Output tokens per second over the run: (bin centres in s, tok/s).

    Each content chunk counts ``output_tokens / chunks`` tokens of its request, so a server that
    packs tokens into chunks is still counted by its usage total.
    """
    width = max(duration_s / bins, 0.05)
    nbins = max(1, math.ceil(duration_s / width))
    counts = np.zeros(nbins)
    for r in records:
        if not r.ok or not r.chunk_times_s:
            continue
        per_chunk = r.output_tokens / len(r.chunk_times_s)
        for t in r.chunk_times_s:
            counts[min(int((r.start_s + t) / width), nbins - 1)] += per_chunk
    centres = [(i + 0.5) * width for i in range(nbins)]
    return centres, [float(c / width) for c in counts]
