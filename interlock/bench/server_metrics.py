"""Server-side figures for a bench run: the server's ``/metrics`` read before and after it.

The core is pure: ``parse`` reads Prometheus text format into samples, ``figures`` turns two
scrapes into what the run changed (means from a histogram's ``_sum`` and ``_count`` deltas,
ratios of counter deltas, counters summed over their labels). ``scrape`` is the only I/O: it asks
an Interlock frontend for ``/metrics?scope=fleet`` (the workers' engine figures included), falls
back to ``/metrics`` where the server refuses the scope, and gives ``None`` where the server has
no metrics at all, so that a bench never fails for want of them.

Each figure reads Interlock's metric first and vLLM's of the same meaning where Interlock's is
absent (``docs/metrics.md``, *Same as*), so a bench of vLLM gets the figures too.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp

Labels = tuple[tuple[str, str], ...]
Samples = dict[tuple[str, Labels], float]
"""(metric name, sorted labels) -> value: one scrape."""

_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}

QUEUE_TIME = ("interlock_engine_queue_time_seconds", "vllm:request_queue_time_seconds")
PREFILL_TIME = ("interlock_engine_prefill_time_seconds", "vllm:request_prefill_time_seconds")
MIGRATIONS = ("interlock_router_migrations_total",)
PREEMPTIONS = ("interlock_engine_preemptions_total", "vllm:num_preemptions_total")
FINISHED = (("interlock_requests_total", "finish_reason"), ("vllm:request_success_total", "finished_reason"))
CACHED_TOKENS: tuple[tuple[str, str, dict[str, str]], ...] = (
    ("interlock_prompt_tokens_cached_total", "interlock_prompt_tokens_total", {}),
    (
        "interlock_engine_prefix_cache_hits_total",
        "interlock_engine_prefix_cache_queries_total",
        {"tier": "any"},
    ),
    ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total", {}),
)
"""(cached, looked up, labels the cached series must have): the first pair the server has."""


def parse(text: str) -> Samples:
    """Prometheus text format (0.0.4) into samples; comments, blank and unreadable lines skipped."""
    samples: Samples = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        sample = _sample(line)
        if sample is not None:
            samples[sample[0]] = sample[1]
    return samples


def _sample(line: str) -> tuple[tuple[str, Labels], float] | None:
    brace = line.find("{")
    space = line.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        name, close = line[:brace], line.rfind("}")
        if close < brace:
            return None
        labels = _labels(line[brace + 1 : close])
        rest = line[close + 1 :].split()
    else:
        name, labels, rest = line[:space], (), line[space + 1 :].split()
    if not name or not rest or labels is None:
        return None
    try:
        return (name, labels), float(rest[0])
    except ValueError:
        return None


def _labels(body: str) -> Labels | None:
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(body):
        m = _LABEL.match(body, pos)
        if m is None:
            return None if body[pos:].strip() else tuple(sorted(out))
        value = re.sub(r"\\[\\\"n]", lambda e: _UNESCAPE[e.group(0)], m.group(2))
        out.append((m.group(1), value))
        pos = m.end()
    return tuple(sorted(out))


def total(samples: Samples, name: str, **match: str) -> float | None:
    """``name``'s series whose labels include ``match``, summed (None: the server has none)."""
    values = [v for (n, labels), v in samples.items() if n == name and match.items() <= dict(labels).items()]
    return sum(values) if values else None


def by_label(samples: Samples, name: str, label: str) -> dict[str, float]:
    """``name``'s series summed per value of ``label``."""
    out: dict[str, float] = {}
    for (n, labels), v in samples.items():
        if n == name:
            key = dict(labels).get(label, "")
            out[key] = out.get(key, 0.0) + v
    return out


@dataclass(frozen=True)
class ServerFigures:
    """What the server counted during one run (None: it does not export that figure)."""

    queue_time_mean_s: float | None = None
    prefill_time_mean_s: float | None = None
    cache_hit_rate: float | None = None
    """Prompt tokens served from cache over prompt tokens, 0..1."""
    migrations: float | None = None
    preemptions: float | None = None
    requests_by_finish_reason: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> ServerFigures:
        known = {k: v for k, v in doc.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def figures(before: Samples, after: Samples) -> ServerFigures:
    """What changed between two scrapes of one server, bracketing a run."""

    def delta(name: str, **match: str) -> float | None:
        a = total(after, name, **match)
        return None if a is None else a - (total(before, name, **match) or 0.0)

    def first(names: tuple[str, ...]) -> float | None:
        return next((d for n in names if (d := delta(n)) is not None), None)

    def mean(names: tuple[str, ...]) -> float | None:
        for n in names:
            s, c = delta(f"{n}_sum"), delta(f"{n}_count")
            if s is not None and c is not None:
                return s / c if c > 0 else None
        return None

    def hit_rate() -> float | None:
        for cached, looked_up, match in CACHED_TOKENS:
            hit, all_ = delta(cached, **match), delta(looked_up)
            if hit is not None and all_ is not None:
                return hit / all_ if all_ > 0 else None
        return None

    finished: dict[str, float] = {}
    for name, label in FINISHED:
        after_counts = by_label(after, name, label)
        if after_counts:
            before_counts = by_label(before, name, label)
            finished = {k: v - before_counts.get(k, 0.0) for k, v in sorted(after_counts.items())}
            finished = {k: v for k, v in finished.items() if v > 0}
            break
    return ServerFigures(
        queue_time_mean_s=mean(QUEUE_TIME),
        prefill_time_mean_s=mean(PREFILL_TIME),
        cache_hit_rate=hit_rate(),
        migrations=first(MIGRATIONS),
        preemptions=first(PREEMPTIONS),
        requests_by_finish_reason=finished,
    )


def metrics_urls(url: str) -> tuple[str, str]:
    """The fleet-wide and the plain ``/metrics`` address of a bench's ``--url``."""
    base = url.rstrip("/").removesuffix("/v1")
    return f"{base}/metrics?scope=fleet", f"{base}/metrics"


async def scrape(url: str, timeout_s: float = 10.0) -> Samples | None:
    """The server's metrics (fleet-wide where it offers them), or None where it has none."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for address in metrics_urls(url):
                async with session.get(address) as resp:
                    if resp.status == 200:
                        return parse(await resp.text())
    except (aiohttp.ClientError, TimeoutError, OSError, UnicodeDecodeError):
        return None
    return None
