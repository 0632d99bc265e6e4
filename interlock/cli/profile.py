"""interlock profile: measure what one worker can do, for the SLA planner.

Runs the engine in this process (the torch runner on the real model, or --runner mock on a
virtual clock, whose times are the mock's step-time model) and measures:

* prefill: seconds to compute one prompt alone, for each --lengths (distinct random tokens,
  so no prefix hit; a prompt longer than --max-num-batched-tokens takes several steps);
* decode: the mean time of --decode-steps decode-only steps with B requests of C
  context tokens running, for each --batches x --contexts that fits the KV cache.

With --engine vllm the engine is vLLM's (interlock.engine.vllm, started here; the start-up is
measured and written as startup_s), measured through the worker's seam in wall-clock time:
prefill as the time to the one output token of a prompt alone, decode as the mean gap between
tokens of B streams of C context tokens once all of them decode.

Writes a JSON capability profile (interlock.planner.profile) that --profile gives to the
SLA planner. Progress goes to stderr. The defaults take well under a minute on two cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from interlock.cli import flags
from interlock.cli.serving import add_dtype_arg, add_vllm_args
from interlock.deploy import DEFAULT_KV_CACHE_GIB, DEFAULT_MAX_NUM_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS
from interlock.engine.clock import VirtualClock
from interlock.engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from interlock.engine.core import EngineCore
from interlock.engine.factory import build_engine
from interlock.engine.vllm.args import normalize, parse_engine_arg
from interlock.errors import ConfigError
from interlock.model_store import DEFAULT_MODEL, resolve_model
from interlock.names import ENGINES, RUNNERS
from interlock.planner import CapabilityProfile, DecodePoint, PrefillPoint
from interlock.protocol.generate import GenerateRequest
from interlock.protocol.sampling import SamplingParams


class RunnerDefaults(NamedTuple):
    """What a flag left out means, per runner (``--runner``, or vllm with ``--engine vllm``)."""

    block_size: int
    num_blocks: int | None
    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    lengths: str
    batches: str
    contexts: str


_TORCH = RunnerDefaults(
    16, None, DEFAULT_MAX_NUM_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS, 2048, "64,256,512,1024", "1,4,16", "128,512"
)  # fmt: skip
DEFAULTS = {
    "mock": RunnerDefaults(
        64, 61_000, 8192, 256, 1 << 17, "256,1024,2048,4096,8192,16384", "1,16,64,256", "1024,4096,12288"
    ),
    "torch": _TORCH,
    "vllm": _TORCH._replace(block_size=32),  # vLLM's CPU build: blocks of 32
}


def _ints(text: str, flag: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",")]
    except ValueError:
        raise ConfigError(f"{flag}: expected comma-separated integers, got {text!r}") from None
    if not out or min(out) < 1:
        raise ConfigError(f"{flag}: every value must be at least 1")
    return out


def build_parser() -> argparse.ArgumentParser:
    p = flags.parser("interlock profile", __doc__)
    p.add_argument("-o", "--out", required=True, help="where to write the profile (JSON)")
    _add_engine_args(p)
    for flag in (
        "--block-size",
        "--num-blocks",
        "--max-num-batched-tokens",
        "--max-num-seqs",
        "--max-model-len",
    ):
        p.add_argument(flag, type=int, default=None, help="default: by runner (see the source)")
    p.add_argument("--kv-cache-gib", type=float, default=DEFAULT_KV_CACHE_GIB, help="torch: KV cache size")
    _add_grid_args(p)
    return flags.apply_environment(p)


def _add_engine_args(p: argparse.ArgumentParser) -> None:
    """The one engine measured (as ``serve``'s engine flags, with this command's defaults)."""
    p.add_argument("--runner", choices=RUNNERS, default="torch")
    p.add_argument(
        "--engine", choices=ENGINES, default="interlock", help="vllm: vLLM's engine (docs/vllm.md)"
    )
    add_vllm_args(p)
    p.add_argument("--model", default=DEFAULT_MODEL)
    add_dtype_arg(p)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    p.add_argument("--speedup", type=float, default=1.0, help="mock runner: divide model time by this")


def _add_grid_args(p: argparse.ArgumentParser) -> None:
    """What is measured: prefill lengths and decode batch x context points, and how often."""
    p.add_argument("--lengths", default=None, help="prefill prompt lengths, comma-separated")
    p.add_argument("--batches", default=None, help="decode batch sizes, comma-separated")
    p.add_argument("--contexts", default=None, help="decode context lengths, comma-separated")
    p.add_argument("--decode-steps", type=int, default=8, help="decode steps timed per point")
    p.add_argument("--repeats", type=int, default=2, help="prefill runs per length (median kept)")


class Profiler:
    def __init__(self, core: EngineCore, vocab: int, max_model_len: int, progress: bool = True) -> None:
        self.core = core
        self.vocab = vocab
        self.max_model_len = max_model_len
        self.progress = progress
        self._ids = itertools.count()
        self._rng = random.Random(0)

    def _say(self, msg: str) -> None:
        if self.progress:
            print(msg, file=sys.stderr, flush=True)

    def _add(self, n: int, max_tokens: int) -> str:
        rid = f"p{next(self._ids)}"
        tokens = tuple(self._rng.randrange(3, self.vocab) for _ in range(n))
        self.core.add_request(
            GenerateRequest(
                request_id=rid,
                token_ids=tokens,
                sampling=SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0),
            )
        )
        return rid

    def warm_up(self) -> None:
        """One short request first: a real runner's first steps pay one-time costs (kernel
        choice, allocations) that are not the worker's speed."""
        self._add(32, 4)
        while self.core.has_unfinished():
            self.core.step()

    def prefill(self, length: int, repeats: int) -> PrefillPoint:
        times = []
        for _ in range(repeats):
            self._add(length, 1)
            total = 0.0
            while self.core.has_unfinished():
                total += self.core.step().step_time_s
            times.append(total)
        self._say(f"prefill {length:>6} tokens: {statistics.median(times) * 1000:8.1f} ms")
        return PrefillPoint(length, statistics.median(times))

    def decode(self, batch: int, context: int, steps: int) -> DecodePoint:
        # Early requests decode while later ones prefill: they must outlast the whole prefill.
        budget = self.core.config.scheduler.max_num_batched_tokens
        lasting = steps + 2 + batch + -(-batch * context // budget)
        ids = [self._add(context, min(lasting, self.max_model_len - context)) for _ in range(batch)]
        started: set[str] = set()
        while len(started) < batch:  # prefill everything, first tokens out
            for out in self.core.step().outputs:
                if out.token_ids:
                    started.add(out.request_id)
        times = [self.core.step().step_time_s for _ in range(steps)]
        for rid in ids:
            self.core.abort(rid)
        while self.core.has_unfinished():
            self.core.step()
        itl = statistics.mean(times)
        self._say(f"decode batch {batch:>4} x {context:>6} context: {itl * 1000:8.2f} ms/token")
        return DecodePoint(batch, context, itl)


def main(argv: list[str]) -> int:
    return flags.run_checked("interlock profile", _run, build_parser().parse_args(argv))


def _run(args: argparse.Namespace) -> int:
    if args.engine == "vllm":
        return asyncio.run(_run_vllm(args))
    _check_interlock_flags(args)
    d = DEFAULTS[args.runner]
    model = ModelConfig(
        model=args.model, runner=args.runner, dtype=args.dtype or "auto", num_threads=args.threads
    )
    config = _engine_config(args, d, model)
    t0 = time.perf_counter()
    print(f"profiling the {args.runner} runner ({args.model})...", file=sys.stderr, flush=True)
    clock = VirtualClock() if args.runner == "mock" else None
    core = build_engine(config, clock=clock, speedup=args.speedup, instance_id="profile")
    kv_tokens = core.pool.num_blocks * config.cache.block_size
    points = _measure(core, args, d, kv_tokens)
    _save(args, _profile(args, args.runner, config, kv_tokens, points), t0)
    return 0


def _check_interlock_flags(args: argparse.Namespace) -> None:
    if args.engine_arg:
        raise ConfigError("--engine-arg needs --engine vllm")
    if args.runner == "mock" and (args.threads or args.dtype is not None):
        raise ConfigError("--threads and --dtype apply to the torch runner only")
    if args.runner == "torch" and args.speedup != 1.0:
        raise ConfigError("--speedup applies to the mock runner only")
    if args.decode_steps < 1 or args.repeats < 1:
        raise ConfigError("--decode-steps and --repeats must be at least 1")


def _engine_config(args: argparse.Namespace, d: RunnerDefaults, model: ModelConfig) -> EngineConfig:
    """The engine measured: ``model``, sized by the flags given and the runner's defaults."""
    return EngineConfig(
        model=model,
        cache=CacheConfig(
            block_size=args.block_size or d.block_size,
            num_blocks=args.num_blocks if args.num_blocks is not None else d.num_blocks,
            kv_cache_gib=args.kv_cache_gib,
        ),
        scheduler=SchedulerConfig(
            max_num_batched_tokens=args.max_num_batched_tokens or d.max_num_batched_tokens,
            max_num_seqs=args.max_num_seqs or d.max_num_seqs,
            max_model_len=args.max_model_len or d.max_model_len,
        ),
    )


def _grid(
    args: argparse.Namespace,
    d: RunnerDefaults,
    max_model_len: int,
    max_num_seqs: int,
    fits: Callable[[int, int], bool],
) -> tuple[list[int], list[tuple[int, int]]]:
    """The prefill lengths and decode (batch, context) points to measure: those that leave room
    for the decode steps in ``max_model_len``, and whose KV ``fits`` the cache."""
    max_len = max_model_len - args.decode_steps - 2
    lengths = [n for n in _ints(args.lengths or d.lengths, "--lengths") if n <= max_len]
    points = [
        (b, c)
        for b in _ints(args.batches or d.batches, "--batches")
        for c in _ints(args.contexts or d.contexts, "--contexts")
        if c <= max_len and b <= max_num_seqs and fits(b, c)
    ]
    return lengths, points


Points = tuple[list[PrefillPoint], list[DecodePoint]]


def _measure(core: EngineCore, args: argparse.Namespace, d: RunnerDefaults, kv_tokens: int) -> Points:
    scheduler, block_size = core.config.scheduler, core.config.cache.block_size
    lengths, grid = _grid(
        args,
        d,
        scheduler.max_model_len,
        scheduler.max_num_seqs,
        lambda b, c: b * (c + args.decode_steps + 2 + block_size) < kv_tokens,
    )
    prof = Profiler(core, int(getattr(core.runner, "vocab_size", 49152)), scheduler.max_model_len)
    prof.warm_up()
    return [prof.prefill(n, args.repeats) for n in lengths], [
        prof.decode(b, c, args.decode_steps) for b, c in grid
    ]


def _profile(
    args: argparse.Namespace,
    runner: str,
    config: EngineConfig,
    kv_tokens: int,
    points: Points,
    startup_s: float = 0.0,
) -> CapabilityProfile:
    prefill, decode = points
    return CapabilityProfile(
        runner=runner,
        model=args.model,
        chunk_tokens=config.scheduler.max_num_batched_tokens,
        max_batch=config.scheduler.max_num_seqs,
        kv_tokens=kv_tokens,
        prefill=tuple(prefill),
        decode=tuple(decode),
        startup_s=startup_s,
    )


def _save(args: argparse.Namespace, profile: CapabilityProfile, t0: float) -> None:
    profile.save(args.out)
    startup = f", start-up {profile.startup_s:.1f} s," if profile.runner == "vllm" else ""
    print(
        f"wrote {args.out}: {len(profile.prefill)} prefill and {len(profile.decode)} decode points"
        f"{startup} in {time.perf_counter() - t0:.1f} s",
        file=sys.stderr,
    )


class EngineProfiler:
    """The same measurements through the worker's seam (``ServingEngine.generate``), in
    wall-clock time: for an engine that runs its own step loop (vLLM)."""

    def __init__(self, engine: Any, vocab: int, max_model_len: int) -> None:
        self.engine = engine
        self.vocab = vocab
        self.max_model_len = max_model_len
        self._ids = itertools.count()
        self._rng = random.Random(0)

    def _request(self, n: int, max_tokens: int) -> GenerateRequest:
        tokens = tuple(self._rng.randrange(3, self.vocab) for _ in range(n))
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
        return GenerateRequest(request_id=f"p{next(self._ids)}", token_ids=tokens, sampling=params)

    async def _times(self, req: GenerateRequest, out: list[float], stop: int) -> None:
        """Arrival time of each output token, until ``stop`` of them (then the stream closes)."""
        stream = self.engine.generate(req)
        async with contextlib.aclosing(stream):
            async for o in stream:
                if o.error is not None:
                    raise ConfigError(f"the engine failed a profiling request: {o.error.message}")
                out.extend(time.perf_counter() for _ in o.token_ids)
                if len(out) >= stop:
                    return

    async def warm_up(self) -> None:
        await self._times(self._request(32, 4), [], 4)

    async def prefill(self, length: int, repeats: int) -> PrefillPoint:
        times = []
        for _ in range(repeats):
            t0, arrivals = time.perf_counter(), list[float]()
            await self._times(self._request(length, 1), arrivals, 1)
            times.append(arrivals[0] - t0)
        print(
            f"prefill {length:>6} tokens: {statistics.median(times) * 1000:8.1f} ms",
            file=sys.stderr,
            flush=True,
        )
        return PrefillPoint(length, statistics.median(times))

    async def decode(self, batch: int, context: int, steps: int) -> DecodePoint:
        total = steps + 2 + batch  # early streams keep decoding while later ones prefill
        arrivals: list[list[float]] = [[] for _ in range(batch)]
        reqs = [self._request(context, min(total * 4, self.max_model_len - context)) for _ in range(batch)]
        tasks = [
            asyncio.create_task(self._times(r, a, total * 4)) for r, a in zip(reqs, arrivals, strict=True)
        ]
        try:
            while min(len(a) for a in arrivals) < 1:  # every stream past its first token
                await asyncio.sleep(0.001)
            start = time.perf_counter()
            while any(sum(t > start for t in a) < steps for a in arrivals) and not all(
                t.done() for t in tasks
            ):
                await asyncio.sleep(0.001)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        gaps = [b - a for arr in arrivals for a, b in itertools.pairwise(t for t in arr if t > start)]
        itl = statistics.mean(gaps) if gaps else 0.0
        print(
            f"decode batch {batch:>4} x {context:>6} context: {itl * 1000:8.2f} ms/token",
            file=sys.stderr,
            flush=True,
        )
        return DecodePoint(batch, context, itl)


async def _run_vllm(args: argparse.Namespace) -> int:
    from interlock.engine import vllm

    if args.runner != "torch" or args.speedup != 1.0:
        raise ConfigError("--runner and --speedup are the interlock engine's")
    if not vllm.installed():
        raise ConfigError(vllm.INSTALL_HINT)
    from interlock.engine.serving import NullKVEventSink

    d = DEFAULTS["vllm"]
    engine_args = normalize(parse_engine_arg(item) for item in args.engine_arg or ())
    model = ModelConfig(
        model=str(resolve_model(args.model)),
        dtype=args.dtype or "auto",
        num_threads=args.threads,
        engine="vllm",
        engine_args=engine_args,
    )
    config = _engine_config(args, d, model)
    print(f"profiling vLLM ({model.model})...", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    engine = await vllm.VllmEngine.create(config, instance_id="profile")
    startup = time.perf_counter() - t0
    print(f"vLLM started in {startup:.1f} s", file=sys.stderr, flush=True)
    try:
        engine.start(NullKVEventSink())
        kv_tokens = engine.kv_blocks_total * engine.block_size
        points = await _measure_vllm(engine, args, d, config.scheduler.max_num_seqs, kv_tokens)
    finally:
        await engine.shutdown()
    _save(args, _profile(args, "vllm", config, kv_tokens, points, startup), t0)
    return 0


async def _measure_vllm(
    engine: Any, args: argparse.Namespace, d: RunnerDefaults, max_num_seqs: int, kv_tokens: int
) -> Points:
    # Each stream may decode 4 x (steps + 2 + batch) tokens (EngineProfiler.decode): room for them.
    lengths, grid = _grid(
        args,
        d,
        engine.context_length,
        max_num_seqs,
        lambda b, c: b * (c + 4 * (args.decode_steps + 2 + b) + engine.block_size) < kv_tokens,
    )
    prof = EngineProfiler(engine, 49152, engine.context_length)
    await prof.warm_up()
    prefill = [await prof.prefill(n, args.repeats) for n in lengths]
    return prefill, [await prof.decode(b, c, args.decode_steps) for b, c in grid]
