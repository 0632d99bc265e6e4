"""What a JSON-schema constraint costs Interlock's engine: decode speed and first-token time.

Issue 38's benchmark: the real default model (SmolLM2) in ``EngineCore`` + ``TorchRunner``,
driven step by step in this process, greedy, ``ignore_eos``.

**Decode** at batch 1 and 8: B requests, ``--tokens`` output tokens each, in two arms on the
same prompts: *plain* (no constraint) and *json* (every request carries ``SCHEMA``, a list of at
least 40 people objects). All B prompts fit one step, so step 1 is the prefill (and the first
token) and every later step decodes one token per request; the figure is B * (tokens - 1) over
the wall time of those later steps (the prefill and the schema's compile excluded). The schema's
document cannot end before ``--tokens``: 40 objects take ~700 tokens; after each json run the
benchmark checks that every matcher accepted all its tokens, none of them EOS, and is neither
stopped nor in error, so every step measured computed a real mask. Arms alternate (A B, then
B A, ...), ``--repeats`` each; the table gives the median and the range, and the median of the
paired ratios json / plain (also from each run's median step, which a burst of other work on a
shared machine barely moves). Target (issue 38): the json arm at most 10% slower.

**First token**: one request alone, a short prompt, ``max_tokens`` 1, timed from
``add_request`` to the step that returns its token: no schema; a schema the engine compiled
before (cached); a schema never seen (``SCHEMA`` with a counter in a property name, so each is
compiled). The engine compiles here; under ``interlock serve`` the frontend compiles the same
spec first (to refuse a bad one), in its own process, so a new schema's compile is paid twice
there, once on each side. ``compile alone`` is ``GrammarCompiler.compile`` of a new schema, the
frontend's share.

**Where the constraint's time goes**: after the timed runs, one json run per batch size with
``Constraints.mask`` and ``accept``, ``Matcher.fill_mask`` and ``apply_bitmask`` wrapped in
timers (the wrappers only add a clock read; the timed runs have none): ms per decode step in
each, against the step's wall time.

    PYTHONPATH=. .venv/bin/python benchmarks/structured_decode.py [--repeats 5] [--tokens 128]
        [--threads 2] [--ttft-repeats 10]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from interlock.engine import constraints as constraints_module
from interlock.engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from interlock.engine.core import EngineCore
from interlock.engine.grammar import GrammarCompiler, Matcher
from interlock.engine.runners.torch_runner import TorchRunner
from interlock.model_store import resolve_model
from interlock.protocol import GenerateRequest, SamplingParams
from interlock.protocol.sampling import StructuredOutput

BATCHES = (1, 8)
TARGET = 0.10
"""Issue 38: decode with the constraint at most 10% slower."""


def schema(name: str = "people") -> str:
    """A list of at least 40 people (name, age, city): keys, strings, integers, nesting."""
    person = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 30},
            "age": {"type": "integer"},
            "city": {"type": "string", "maxLength": 30},
        },
        "required": ["name", "age", "city"],
    }
    return json.dumps(
        {
            "type": "object",
            "properties": {name: {"type": "array", "items": person, "minItems": 40}},
            "required": [name],
        }
    )


SCHEMA = schema()
TOPICS = ("a sailing club", "a chess school", "a bakery", "a hospital ward", "a football team",
          "a law firm", "a string quartet", "a research lab")  # fmt: skip


def prompts(tokenizer: Tokenizer, count: int) -> list[tuple[int, ...]]:
    """The same B prompts in both arms."""
    return [
        tuple(
            tokenizer.encode(f"List the members of {TOPICS[i % len(TOPICS)]} as JSON: name, age, city.").ids
        )
        for i in range(count)
    ]


class Bench:
    def __init__(self, threads: int) -> None:
        folder = resolve_model("smollm2")
        self.folder = folder
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        config = EngineConfig(
            model=ModelConfig(model=str(folder), num_threads=threads),
            cache=CacheConfig(kv_cache_gib=1.0, enable_prefix_caching=False),
            scheduler=SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=2048, max_model_len=2048),
        )
        self.runner = TorchRunner.from_config(config)
        self.core = EngineCore(config, self.runner)
        self._ids: Iterator[int] = iter(range(1 << 62))

    def params(self, max_tokens: int, spec: str | None) -> SamplingParams:
        structured = None if spec is None else StructuredOutput(kind="json_schema", spec=spec)
        return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, structured=structured)

    def run(
        self,
        batch: list[tuple[int, ...]],
        max_tokens: int,
        spec: str | None,
        after_step: Callable[[], None] = lambda: None,
    ) -> list[float]:
        """Generate; the wall seconds of each step (step 1: the prefill and first tokens)."""
        params = self.params(max_tokens, spec)
        ids = [f"r{next(self._ids)}" for _ in batch]
        for rid, prompt in zip(ids, batch, strict=True):
            self.core.add_request(GenerateRequest(request_id=rid, token_ids=prompt, sampling=params))
        steps: list[float] = []
        outputs: dict[str, list[int]] = {rid: [] for rid in ids}
        while self.core.has_unfinished():
            start = time.perf_counter()
            result = self.core.step()
            steps.append(time.perf_counter() - start)
            after_step()
            got = 0
            for out in result.outputs:
                if out.error is not None:
                    raise RuntimeError(out.error.message)
                outputs[out.request_id] += out.token_ids
                got += len(out.token_ids)
            if got != len(batch):
                raise RuntimeError(f"step {len(steps)} gave {got} tokens for {len(batch)} requests")
        if len(steps) != max_tokens or any(len(t) != max_tokens for t in outputs.values()):
            raise RuntimeError("a request did not get all its tokens, one per step")
        if spec is not None:
            self._check_unfinished(ids, outputs)
        return steps

    def _check_unfinished(self, ids: list[str], outputs: dict[str, list[int]]) -> None:
        """Every mask computed was a real one: the grammar never reached its end.

        (A finished request's matcher is dropped at the next step, so it is still here.)"""
        eos = set(self.runner.eos_token_ids)
        for rid in ids:
            matcher = self.runner.constraints.matcher(rid)
            if matcher is None or matcher.error or matcher.is_terminated:
                raise RuntimeError(f"{rid}: its constraint ended or failed early")
            if matcher.tokens != outputs[rid] or eos & set(outputs[rid]):
                raise RuntimeError(f"{rid}: its matcher did not accept its {len(outputs[rid])} tokens")

    def first_token_s(self, prompt: tuple[int, ...], spec: str | None) -> float:
        return sum(self.run([prompt], 1, spec))


# ---- the measurements ----
def decode(bench: Bench, repeats: int, tokens: int) -> dict[int, dict[str, list[float]]]:
    """Per batch size and arm: each repeat's tok/s, and its median decode step (seconds)."""
    keys = ("plain", "json", "plain step", "json step")
    results: dict[int, dict[str, list[float]]] = {b: {k: [] for k in keys} for b in BATCHES}
    for rep in range(repeats):
        for b in BATCHES:
            batch = prompts(bench.tokenizer, b)
            arms = ("plain", "json") if rep % 2 == 0 else ("json", "plain")
            for arm in arms:
                steps = bench.run(batch, tokens, SCHEMA if arm == "json" else None)
                results[b][arm].append(b * (tokens - 1) / sum(steps[1:]))
                results[b][f"{arm} step"].append(statistics.median(steps[1:]))
    return results


def first_token(bench: Bench, repeats: int) -> dict[str, list[float]]:
    """TTFT seconds per case, the cases rotated each repeat."""
    prompt = prompts(bench.tokenizer, 1)[0]
    counter = iter(range(1 << 62))
    cases: dict[str, Callable[[], str | None]] = {
        "no schema": lambda: None,
        "cached schema": lambda: SCHEMA,
        "new schema": lambda: schema(f"people_{os.getpid()}_{next(counter)}"),
    }
    names = list(cases)
    times: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(repeats):
        for name in names[rep % 3 :] + names[: rep % 3]:
            times[name].append(bench.first_token_s(prompt, cases[name]()))
    compiler = GrammarCompiler.from_folder(
        bench.folder, eos_token_ids=bench.runner.eos_token_ids, vocab_size=bench.runner.vocab_size
    )
    times["compile alone (frontend's share)"] = []
    for i in range(repeats):
        spec = StructuredOutput(kind="json_schema", spec=schema(f"frontend_{i}"))
        start = time.perf_counter()
        compiler.compile(spec)
        times["compile alone (frontend's share)"].append(time.perf_counter() - start)
    return times


class _Timers:
    """Seconds spent in wrapped calls, per name, in the current step and in each step before."""

    def __init__(self) -> None:
        self.current: dict[str, float] = {}
        self.steps: list[dict[str, float]] = []

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        self.current[name] = 0.0

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.current[name] += time.perf_counter() - start

        return timed

    def lap(self) -> None:
        self.steps.append(self.current)
        self.current = dict.fromkeys(self.current, 0.0)


def profile(bench: Bench, tokens: int) -> dict[int, dict[str, float]]:
    """ms per decode step (step 1 left out, as in the decode figure) in each part of the
    constraint's work: ``mask`` (of it ``fill``: the matchers' bitmasks, ``apply``: bitmask to
    logits, the rest: per-row Python) and ``accept``; ``step``: the whole step."""
    constraints = bench.runner.constraints
    mask, accept = constraints.mask, constraints.accept
    fill, apply = Matcher.fill_mask, constraints_module.apply_bitmask
    results: dict[int, dict[str, float]] = {}
    try:
        for b in BATCHES:
            timers = _Timers()
            constraints.mask = timers.wrap("mask", mask)  # type: ignore[method-assign]
            constraints.accept = timers.wrap("accept", accept)  # type: ignore[method-assign]
            Matcher.fill_mask = timers.wrap("fill", fill)  # type: ignore[method-assign]
            constraints_module.apply_bitmask = timers.wrap("apply", apply)
            steps = bench.run(prompts(bench.tokenizer, b), tokens, SCHEMA, after_step=timers.lap)
            decode_steps = timers.steps[1:]
            parts = {k: 1e3 * statistics.fmean(s[k] for s in decode_steps) for k in timers.current}
            parts["rest of mask"] = parts["mask"] - parts["fill"] - parts["apply"]
            parts["step"] = 1e3 * statistics.fmean(steps[1:])
            results[b] = parts
    finally:
        constraints.mask, constraints.accept = mask, accept  # type: ignore[method-assign]
        Matcher.fill_mask = fill  # type: ignore[method-assign]
        constraints_module.apply_bitmask = apply
    return results


# ---- the report ----
def cpu() -> str:
    info: dict[str, str] = {}
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        info.setdefault(key.strip(), value.strip())
    flags = set(info.get("flags", "").split())
    bf16 = "AVX-512 BF16" if "avx512_bf16" in flags else "no AVX-512 BF16"
    return (
        f"{info.get('model name', 'unknown CPU')} (family {info.get('cpu family', '?')} "
        f"model {info.get('model', '?')}; {bf16}), {os.cpu_count()} vCPU"
    )


def _ms(values: list[float]) -> str:
    return f"{1e3 * statistics.median(values):.1f} ({1e3 * min(values):.1f}–{1e3 * max(values):.1f})"


def report(
    decoded: dict[int, dict[str, list[float]]],
    ttft: dict[str, list[float]],
    parts: dict[int, dict[str, float]],
    tokens: int,
) -> tuple[str, bool]:
    lines = [
        "| batch | plain tok/s, median (range) | json schema tok/s, median (range) "
        "| json / plain, median of pairs | the same from each run's median step "
        f"| ms per decode step, plain / json | ≤ {TARGET:.0%} slower |",
        "|---:|---:|---:|---:|---:|---:|---|",
    ]
    met = True
    for b, arms in decoded.items():
        plain, constrained = arms["plain"], arms["json"]
        ratio = statistics.median(c / p for c, p in zip(constrained, plain, strict=True))
        step_ratio = statistics.median(
            p / c for c, p in zip(arms["json step"], arms["plain step"], strict=True)
        )
        ok = ratio >= 1 - TARGET
        met &= ok
        lines.append(
            f"| {b} | {statistics.median(plain):.1f} ({min(plain):.1f}–{max(plain):.1f}) "
            f"| {statistics.median(constrained):.1f} ({min(constrained):.1f}–{max(constrained):.1f}) "
            f"| {ratio:.3f} | {step_ratio:.3f} | {1e3 * b / statistics.median(plain):.2f} / "
            f"{1e3 * b / statistics.median(constrained):.2f} | {'met' if ok else '**missed**'} |"
        )
    lines += ["", "| first token (batch 1, max_tokens 1) | ms, median (range) | n |", "|---|---:|---:|"]
    for name, values in ttft.items():
        lines.append(f"| {name} | {_ms(values)} | {len(values)} |")
    lines += [
        "",
        f"Constraint's work per decode step (one json run of {tokens} tokens per batch size; ms):",
        "",
        "| batch | step | mask | of it: fill (matchers) | apply (bitmask to logits) | rest (per-row Python) "
        "| accept | constraint's share |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for b, p in parts.items():
        share = (p["mask"] + p["accept"]) / p["step"]
        lines.append(
            f"| {b} | {p['step']:.2f} | {p['mask']:.3f} | {p['fill']:.3f} | {p['apply']:.3f} "
            f"| {p['rest of mask']:.3f} | {p['accept']:.3f} | {share:.1%} |"
        )
    return "\n".join(lines), met


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs of each arm per batch size")
    parser.add_argument("--tokens", type=int, default=128, help="output tokens per request")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--ttft-repeats", type=int, default=10, help="first-token requests per case")
    args = parser.parse_args()
    bench = Bench(args.threads)
    load_before = os.getloadavg()
    started = datetime.datetime.now(datetime.UTC)
    for b in BATCHES:  # warm-up: the model's kernels, the grammar compiler (~0.3 s), SCHEMA
        bench.run(prompts(bench.tokenizer, b), 16, None)
        bench.run(prompts(bench.tokenizer, b), 16, SCHEMA)
    decoded = decode(bench, args.repeats, args.tokens)
    ttft = first_token(bench, args.ttft_repeats)
    parts = profile(bench, args.tokens)
    table, met = report(decoded, ttft, parts, args.tokens)
    load_after = os.getloadavg()
    print(
        f"{started:%Y-%m-%d %H:%M} UTC; {cpu()}; torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, dtype {bench.runner.model.dtype}; "
        f"load average (1 min) {load_before[0]:.1f} before, {load_after[0]:.1f} after\n"
    )
    print(
        f"SmolLM2, greedy, ignore_eos, {args.tokens} output tokens per request, "
        f"{args.repeats} runs per arm alternating; json schema: {len(SCHEMA)} characters, "
        "never finished before the last token (checked)\n"
    )
    print(table)
    print(
        f"\nTarget (json at most {TARGET:.0%} slower than plain, at batch 1 and 8): {'met' if met else 'MISSED'}"
    )


if __name__ == "__main__":
    main()
