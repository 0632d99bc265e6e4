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
from typing import Any

from interlock.cli import flags
from interlock.engine.clock import VirtualClock
from interlock.engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from interlock.engine.core import EngineCore
from interlock.engine.factory import build_engine
from interlock.engine.vllm.args import normalize, parse_engine_arg
from interlock.errors import ConfigError
from interlock.names import DTYPES, ENGINES
from interlock.planner import CapabilityProfile, DecodePoint, PrefillPoint
from interlock.protocol.generate import GenerateRequest
from interlock.protocol.sampling import SamplingParams

DEFAULTS = {
    # runner: (block size, blocks, batched tokens, seqs, model len, lengths, batches, contexts)
    "mock": (
        64,
        61_000,
        8192,
        256,
        1 << 17,
        "256,1024,2048,4096,8192,16384",
        "1,16,64,256",
        "1024,4096,12288",
    ),
    "torch": (16, None, 2048, 64, 2048, "64,256,512,1024", "1,4,16", "128,512"),
    "vllm": (32, None, 2048, 64, 2048, "64,256,512,1024", "1,4,16", "128,512"),
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
    p = argparse.ArgumentParser(
        prog="interlock profile", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("-o", "--out", required=True, help="where to write the profile (JSON)")
    p.add_argument("--runner", choices=("torch", "mock"), default="torch")
    p.add_argument(
        "--engine", choices=ENGINES, default="interlock", help="vllm: vLLM's engine (docs/vllm.md)"
    )
    p.add_argument(
        "--engine-arg",
        action="append",
        default=None,
        metavar="KEY=VALUE",
        help="with --engine vllm: one of vLLM's engine arguments (repeat for more)",
    )
    p.add_argument("--model", default="smollm2")
    p.add_argument(
        "--dtype", choices=DTYPES, default=None, help="torch runner: model dtype (default: auto, as serve)"
    )
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    p.add_argument("--speedup", type=float, default=1.0, help="mock runner: divide model time by this")
    for flag in (
        "--block-size",
        "--num-blocks",
        "--max-num-batched-tokens",
        "--max-num-seqs",
        "--max-model-len",
    ):
        p.add_argument(flag, type=int, default=None, help="default: by runner (see the source)")
    p.add_argument("--kv-cache-gib", type=float, default=1.0, help="torch: KV cache size")
    p.add_argument("--lengths", default=None, help="prefill prompt lengths, comma-separated")
    p.add_argument("--batches", default=None, help="decode batch sizes, comma-separated")
    p.add_argument("--contexts", default=None, help="decode context lengths, comma-separated")
    p.add_argument("--decode-steps", type=int, default=8, help="decode steps timed per point")
    p.add_argument("--repeats", type=int, default=2, help="prefill runs per length (median kept)")
    return flags.apply_environment(p)


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
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except ConfigError as e:
        print(f"interlock profile: {e.message}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    if args.engine == "vllm":
        return asyncio.run(_run_vllm(args))
    if args.engine_arg:
        raise ConfigError("--engine-arg needs --engine vllm")
    bs, blocks, chunk, seqs, mml, lengths, batches, contexts = DEFAULTS[args.runner]
    if args.runner == "mock" and (args.threads or args.dtype is not None):
        raise ConfigError("--threads and --dtype apply to the torch runner only")
    if args.runner == "torch" and args.speedup != 1.0:
        raise ConfigError("--speedup applies to the mock runner only")
    if args.decode_steps < 1 or args.repeats < 1:
        raise ConfigError("--decode-steps and --repeats must be at least 1")
    config = EngineConfig(
        model=ModelConfig(
            model=args.model, runner=args.runner, dtype=args.dtype or "auto", num_threads=args.threads
        ),
        cache=CacheConfig(
            block_size=args.block_size or bs,
            num_blocks=args.num_blocks if args.num_blocks is not None else blocks,
            kv_cache_gib=args.kv_cache_gib,
        ),
        scheduler=SchedulerConfig(
            max_num_batched_tokens=args.max_num_batched_tokens or chunk,
            max_num_seqs=args.max_num_seqs or seqs,
            max_model_len=args.max_model_len or mml,
        ),
    )
    t0 = time.perf_counter()
    print(f"profiling the {args.runner} runner ({args.model})...", file=sys.stderr, flush=True)
    clock = VirtualClock() if args.runner == "mock" else None
    core = build_engine(config, clock=clock, speedup=args.speedup, instance_id="profile")
    kv_tokens = core.pool.num_blocks * config.cache.block_size
    vocab = int(getattr(core.runner, "vocab_size", 49152))
    prof = Profiler(core, vocab, config.scheduler.max_model_len)
    prof.warm_up()
    max_len = config.scheduler.max_model_len - args.decode_steps - 2
    prefill = [
        prof.prefill(n, args.repeats) for n in _ints(args.lengths or lengths, "--lengths") if n <= max_len
    ]
    decode = [
        prof.decode(b, c, args.decode_steps)
        for b in _ints(args.batches or batches, "--batches")
        for c in _ints(args.contexts or contexts, "--contexts")
        if c <= max_len
        and b <= config.scheduler.max_num_seqs
        and b * (c + args.decode_steps + 2 + config.cache.block_size) < kv_tokens
    ]
    profile = CapabilityProfile(
        runner=args.runner,
        model=args.model,
        chunk_tokens=config.scheduler.max_num_batched_tokens,
        max_batch=config.scheduler.max_num_seqs,
        kv_tokens=kv_tokens,
        prefill=tuple(prefill),
        decode=tuple(decode),
    )
    profile.save(args.out)
    print(
        f"wrote {args.out}: {len(prefill)} prefill and {len(decode)} decode points in "
        f"{time.perf_counter() - t0:.1f} s",
        file=sys.stderr,
    )
    return 0


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
    from interlock.model_store import resolve_model

    bs, blocks, chunk, seqs, mml, lengths, batches, contexts = DEFAULTS["vllm"]
    engine_args = normalize(parse_engine_arg(item) for item in args.engine_arg or ())
    path = str(resolve_model(args.model))
    config = EngineConfig(
        model=ModelConfig(
            model=path,
            dtype=args.dtype or "auto",
            num_threads=args.threads,
            engine="vllm",
            engine_args=engine_args,
        ),
        cache=CacheConfig(
            block_size=args.block_size or bs, num_blocks=args.num_blocks, kv_cache_gib=args.kv_cache_gib
        ),
        scheduler=SchedulerConfig(
            max_num_batched_tokens=args.max_num_batched_tokens or chunk,
            max_num_seqs=args.max_num_seqs or seqs,
            max_model_len=args.max_model_len or mml,
        ),
    )
    print(f"profiling vLLM ({path})...", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    engine = await vllm.VllmEngine.create(config, instance_id="profile")
    startup = time.perf_counter() - t0
    print(f"vLLM started in {startup:.1f} s", file=sys.stderr, flush=True)
    try:
        from interlock.engine.serving import NullKVEventSink

        engine.start(NullKVEventSink())
        mml = engine.context_length
        kv_tokens = engine.kv_blocks_total * engine.block_size
        prof = EngineProfiler(engine, 49152, mml)
        await prof.warm_up()
        max_len = mml - args.decode_steps - 2
        prefill = [
            await prof.prefill(n, args.repeats)
            for n in _ints(args.lengths or lengths, "--lengths")
            if n <= max_len
        ]
        decode = [
            await prof.decode(b, c, args.decode_steps)
            for b in _ints(args.batches or batches, "--batches")
            for c in _ints(args.contexts or contexts, "--contexts")
            if c <= max_len
            and b <= config.scheduler.max_num_seqs
            and b * (c + 4 * (args.decode_steps + 2 + b) + engine.block_size) < kv_tokens
        ]
    finally:
        await engine.shutdown()
    profile = CapabilityProfile(
        runner="vllm",
        model=args.model,
        chunk_tokens=config.scheduler.max_num_batched_tokens,
        max_batch=config.scheduler.max_num_seqs,
        kv_tokens=kv_tokens,
        prefill=tuple(prefill),
        decode=tuple(decode),
        startup_s=startup,
    )
    profile.save(args.out)
    print(
        f"wrote {args.out}: {len(prefill)} prefill and {len(decode)} decode points, start-up {startup:.1f} s, "
        f"in {time.perf_counter() - t0:.1f} s",
        file=sys.stderr,
    )
    return 0
