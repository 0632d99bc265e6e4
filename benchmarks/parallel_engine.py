"""Tensor and pipeline parallelism on this machine: the engine's step times per group shape.

Usage: ``.venv/bin/python benchmarks/parallel_engine.py [--shapes 1x1,2x1,1x2,2x2] [--dtype auto]
[--batches 1,8,32] [--prompt 512] [--context 256] [--threads N]``

For each ``TxP`` group (``1x1``: one process, the ``TorchRunner``; else the ``GroupRunner`` of
``engine.parallel``) on the default model: the time of one prefill of ``--prompt`` tokens
(fresh blocks each time), and of one decode step of ``--batches`` requests at ``--context``
tokens each (tokens/s = batch / step time); medians of repeated runs. Every shape gets the
same ``--threads`` in all (default: the machine's cores), shared equally by its ranks, as
``interlock serve`` gives them. Also the resident memory of all the group's processes. Each
shape runs in a fresh process of its own. The table goes to stdout as Markdown, with the
CPU's name.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from interlock.engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig  # noqa: E402
from interlock.engine.factory import build_runner  # noqa: E402
from interlock.engine.runner import ModelRunner, ScheduledRequest, SchedulerOutput  # noqa: E402
from interlock.protocol import SamplingParams  # noqa: E402

GREEDY = SamplingParams(temperature=0.0)
BLOCK = 16


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def rss_mib(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total / 1024


def _tokens(n: int, salt: int) -> list[int]:
    return [100 + (i * 7919 + salt * 104729) % 40000 for i in range(n)]


def prefill_ms(runner: ModelRunner, prompt: int, repeats: int) -> float:
    blocks = -(-prompt // BLOCK)
    times = []
    for k in range(repeats + 1):
        table = list(range(blocks))
        t0 = time.perf_counter()
        runner.execute(
            SchedulerOutput([ScheduledRequest(f"p{k}", _tokens(prompt, k), 0, table, GREEDY, True)])
        )
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:]) * 1e3


def decode_ms(runner: ModelRunner, batch: int, context: int, steps: int) -> float:
    per = -(-(context + steps + 1) // BLOCK)
    tables = [list(range(r * per, (r + 1) * per)) for r in range(batch)]
    prefill = [
        ScheduledRequest(f"d{r}", _tokens(context, r), 0, tables[r], GREEDY, True) for r in range(batch)
    ]
    for r in prefill:  # one at a time: a step's budget
        runner.execute(SchedulerOutput([r]))
    times = []
    for s in range(steps + 1):
        step = [
            ScheduledRequest(f"d{r}", [200 + r], context + s, tables[r], GREEDY, True) for r in range(batch)
        ]
        t0 = time.perf_counter()
        runner.execute(SchedulerOutput(step))
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:]) * 1e3


def one_shape(args: argparse.Namespace, shape: str, batches: list[int]) -> str:
    t, p = (int(x) for x in shape.split("x"))
    need = max(batches) * -(-(args.context + args.steps + 1) // BLOCK) + -(-args.prompt // BLOCK)
    config = EngineConfig(
        model=ModelConfig(
            dtype=args.dtype, tensor_parallel_size=t, pipeline_parallel_size=p, num_threads=args.threads
        ),
        cache=CacheConfig(num_blocks=need + 8, block_size=BLOCK),
        scheduler=SchedulerConfig(max_model_len=max(args.prompt, args.context + args.steps + 1)),
    )
    runner = build_runner(config)
    try:
        pre = prefill_ms(runner, args.prompt, args.repeats)
        rates = [b / decode_ms(runner, b, args.context, args.steps) * 1e3 for b in batches]
        ranks = getattr(runner, "ranks", None)
        pids = [os.getpid()] + ([proc.pid for proc in ranks.procs] if ranks is not None else [])
        memory = rss_mib(pids)
    finally:
        runner.close()
    cells = " | ".join(f"{r:.1f}" for r in rates)
    return f"| {t} x {p} | {pre:.1f} | {cells} | {memory:.0f} |"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="1x1,2x1,1x2,2x2")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--one", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    if args.one:
        print(one_shape(args, args.one, batches), flush=True)
        return 0
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores; dtype {args.dtype}; {args.threads} threads per shape")
    print()
    head = " | ".join(f"decode b={b} tok/s" for b in batches)
    print(f"| T x P | prefill {args.prompt} ms | {head} | RSS MiB |")
    print("|---|---|" + "---|" * len(batches) + "---|")
    for shape in args.shapes.split(","):
        argv = [sys.executable, __file__, "--one", shape, *sys.argv[1:]]
        out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
        print(out.strip().splitlines()[-1], flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
