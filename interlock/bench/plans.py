"""Load plans from options: fixed concurrency, fixed rate, trace replay (pure builders)."""

from __future__ import annotations

from interlock.bench.loadgen import LoadPlan
from interlock.bench.prompts import SyntheticSpec, synthetic_prompt
from interlock.bench.schedule import Arrival, arrival_offsets
from interlock.bench.trace import TraceEntry, TracePrompts, send_offsets
from interlock.bench.vocab import Vocab
from interlock.errors import ConfigError


def concurrency_plan(spec: SyntheticSpec, vocab: Vocab, concurrency: int, max_requests: int) -> LoadPlan:
    if concurrency < 1:
        raise ConfigError("concurrency must be at least 1")
    return LoadPlan(
        label=f"c={concurrency}",
        load={"mode": "concurrency", "concurrency": concurrency, **_spec_json(spec)},
        prompt=lambda i: synthetic_prompt(spec, vocab, i),
        count=max_requests,
        concurrency=concurrency,
    )


def rate_plan(
    spec: SyntheticSpec,
    vocab: Vocab,
    rate: float,
    max_requests: int,
    arrival: Arrival = "poisson",
    max_concurrency: int | None = None,
) -> LoadPlan:
    return LoadPlan(
        label=f"rate={rate:g}/s",
        load={"mode": "rate", "rate": rate, "arrival": arrival, "max_concurrency": max_concurrency, **_spec_json(spec)},
        prompt=lambda i: synthetic_prompt(spec, vocab, i),
        count=max_requests,
        offsets=arrival_offsets(rate, max_requests, arrival, spec.seed),
        concurrency=max_concurrency,
    )


def trace_plan(
    entries: list[TraceEntry],
    vocab: Vocab,
    time_scale: float = 1.0,
    block_size: int = 512,
    max_concurrency: int | None = None,
    source: str = "trace",
) -> LoadPlan:
    prompts = TracePrompts(vocab, block_size)
    return LoadPlan(
        label=f"trace x{time_scale:g}",
        load={"mode": "trace", "trace": source, "time_scale": time_scale, "block_size": block_size,
              "max_concurrency": max_concurrency},
        prompt=lambda i: prompts.prompt(entries[i], i),
        count=len(entries),
        offsets=send_offsets(entries, time_scale),
        concurrency=max_concurrency,
    )


def _spec_json(spec: SyntheticSpec) -> dict[str, object]:
    return {
        "input_len": str(spec.input_len),
        "output_len": str(spec.output_len),
        "prefix_len": spec.prefix_len,
        "prefix_groups": spec.prefix_groups,
        "seed": spec.seed,
    }
