"""Load plans from options: fixed concurrency, fixed rate, trace replay (pure builders)."""

from __future__ import annotations

from collections.abc import Sequence

from interlock import mooncake
from interlock.bench.loadgen import LoadPlan
from interlock.bench.prompts import SyntheticSpec, synthetic_prompt
from interlock.bench.schedule import Arrival, arrival_offsets
from interlock.bench.trace import TracePrompts
from interlock.bench.vocab import Vocab
from interlock.errors import ConfigError
from interlock.mooncake import TRACE_BLOCK_SIZE, MooncakeRecord


def concurrency_plan(spec: SyntheticSpec, vocab: Vocab, concurrency: int, max_requests: int) -> LoadPlan:
    if concurrency < 1:
        raise ConfigError("concurrency must be at least 1")
    load: dict[str, object] = {"mode": "concurrency", "concurrency": concurrency}
    return _synthetic_plan(spec, vocab, max_requests, f"c={concurrency}", load, concurrency=concurrency)


def rate_plan(
    spec: SyntheticSpec,
    vocab: Vocab,
    rate: float,
    max_requests: int,
    arrival: Arrival = "poisson",
    max_concurrency: int | None = None,
) -> LoadPlan:
    load: dict[str, object] = {
        "mode": "rate",
        "rate": rate,
        "arrival": arrival,
        "max_concurrency": max_concurrency,
    }
    offsets = arrival_offsets(rate, max_requests, arrival, spec.seed)
    return _synthetic_plan(
        spec, vocab, max_requests, f"rate={rate:g}/s", load, offsets=offsets, concurrency=max_concurrency
    )


def trace_plan(
    records: list[MooncakeRecord],
    vocab: Vocab,
    speedup: float = 1.0,
    block_size: int = TRACE_BLOCK_SIZE,
    max_concurrency: int | None = None,
    source: str = "trace",
) -> LoadPlan:
    """Replay ``records`` at an arrival speed-up of ×``speedup`` (``mooncake.arrival_offsets``)."""
    prompts = TracePrompts(vocab, block_size)
    return LoadPlan(
        label=f"trace x{speedup:g}",
        load={
            "mode": "trace",
            "trace": source,
            "speedup": speedup,
            "block_size": block_size,
            "max_concurrency": max_concurrency,
        },
        prompt=lambda i: prompts.prompt(records[i], i),
        count=len(records),
        offsets=mooncake.arrival_offsets(records, speedup),
        concurrency=max_concurrency,
    )


def _synthetic_plan(
    spec: SyntheticSpec,
    vocab: Vocab,
    max_requests: int,
    label: str,
    load: dict[str, object],
    *,
    offsets: Sequence[float] | None = None,
    concurrency: int | None = None,
) -> LoadPlan:
    """``max_requests`` prompts of ``spec``; ``load`` (the mode's options) gets the spec's."""
    return LoadPlan(
        label=label,
        load={**load, **_spec_json(spec)},
        prompt=lambda i: synthetic_prompt(spec, vocab, i),
        count=max_requests,
        offsets=offsets,
        concurrency=concurrency,
    )


def _spec_json(spec: SyntheticSpec) -> dict[str, object]:
    return {
        "input_len": str(spec.input_len),
        "output_len": str(spec.output_len),
        "prefix_len": spec.prefix_len,
        "prefix_groups": spec.prefix_groups,
        "seed": spec.seed,
    }
