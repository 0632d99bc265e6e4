"""Trace replay, policy against policy, and against Dynamo 1.6.1's router on the same trace.

Setup (as in /work/shared/anchors/dynamo.md): the Mooncake conversation trace, 8 simulated
workers of 61,000 blocks of 64 tokens (together about a third of the trace's distinct blocks),
the mock timing model (Dynamo's polynomial fit), 8,192 batched tokens and 256 sequences per
step, chunked prefill and prefix caching on. Arrivals are sped up until round-robin's TTFT p99
reaches 5 s (``--speedup`` to fix it, ``--speedups 7.5,9,10,12`` for several). Interlock's
policies run in ``interlock.sim``; Dynamo's run through ``dynamo.replay.run_trace_replay`` in its
own virtual environment (``--dynamo-python``), skipped if that is missing.

``--workload agent`` replays the long-context agent workload instead (``sim.synthetic
.AgentSpec``, written as a Mooncake trace that Dynamo reads too), ``--workload rag``
retrieval-augmented chat over a shared document collection (``sim.synthetic.RagSpec``), each with
per-worker capacity a twelfth of its distinct blocks unless ``--blocks`` says otherwise.

Each row also gives the pooled-cache bound (one LRU cache as large as all workers together) and
the requests refused by the router's admission queue.

    .venv/bin/python benchmarks/replay_compare.py [--speedup 7.5] [--json out.json]
    .venv/bin/python benchmarks/replay_compare.py --workload agent --speedups 1,2,3 --policies kv,round-robin
    .venv/bin/python benchmarks/replay_compare.py --workload rag --search-from 1 --policies kv,round-robin,least-loaded
    .venv/bin/python benchmarks/replay_compare.py --speedup 7.5 --policies kv --cost stall_weight=0,miss_weight=2
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from interlock.mooncake import TRACE_BLOCK_SIZE, load_mooncake, write_mooncake
from interlock.router import RouterConfig
from interlock.router.cost import CostParams
from interlock.sim import ReplayConfig, TraceHasher, mooncake_requests, replay
from interlock.sim.synthetic import AgentSpec, RagSpec, agent_records, rag_records

TRACE = "/work/shared/traces/mooncake_conversation_trace.jsonl"
DYNAMO_SCRIPT = """
import json, sys, time
from dynamo.replay import run_trace_replay
trace, mode, speed, blocks, workers = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
t = time.time()
rep = run_trace_replay([trace], extra_engine_args={"engine": {"num_gpu_blocks": blocks, "block_size": 64}},
    num_workers=workers, router_mode=mode, arrival_speedup_ratio=speed, trace_block_size=512,
    trace_format="mooncake", replay_mode="offline", capture_per_request=False)
s = rep.summary
print(json.dumps({"hit_ratio": s["prefix_cache_reused_ratio"], "ttft_p50_ms": s["median_ttft_ms"],
    "ttft_p99_ms": s["p99_ttft_ms"], "itl_p50_ms": s["median_itl_ms"], "itl_p99_ms": s["p99_itl_ms"],
    "requests_per_s": s["request_throughput_rps"], "output_tokens_per_s": s["output_throughput_tok_s"],
    "wall_s": time.time() - t}))
"""


def parse_cost(text: str) -> CostParams:
    """``CostParams`` with the fields named in ``text`` (``name=value,...``) changed; an unknown
    name or a value of the wrong type is an error."""
    kw: dict[str, object] = {}
    defaults = CostParams()
    for item in filter(None, (x.strip() for x in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or not hasattr(defaults, name):
            raise SystemExit(f"--cost: {item!r} is not NAME=VALUE with NAME a CostParams field")
        current = getattr(defaults, name)
        if isinstance(current, bool):
            if value.lower() not in ("0", "1", "true", "false", "on", "off"):
                raise SystemExit(f"--cost: {name} takes 0/1, true/false or on/off, not {value!r}")
            kw[name] = value.lower() in ("1", "true", "on")
        else:
            try:
                kw[name] = type(current)(value)
            except ValueError:
                raise SystemExit(f"--cost: {name} takes a {type(current).__name__}, not {value!r}") from None
    return replace(defaults, **kw)  # type: ignore[arg-type]


def run_ours(records, hasher: TraceHasher, speedup: float, policy: str, args) -> dict:
    reqs = mooncake_requests(records, block_size=64, speedup=speedup, hasher=hasher)
    cfg = ReplayConfig(
        num_workers=args.workers,
        num_blocks=args.blocks,
        router=RouterConfig(
            policy=policy,
            block_size=64,
            seed=0,
            max_queue_wait_s=args.max_queue_wait,
            cost=parse_cost(args.cost),
        ),
    )
    return replay(reqs, cfg).to_dict()


DYNAMO_CACHE = Path("/tmp/replay_compare_dynamo.json")
"""Dynamo's rows by (trace, speed-up, mode, blocks, workers): its code does not change between
runs of this script, so a rerun reuses them (delete the file to measure again)."""


def run_dynamo(python: str, speedup: float, mode: str, args) -> dict | None:
    if not Path(python).exists():
        return None
    key = f"{args.trace}|{speedup}|{mode}|{args.blocks}|{args.workers}"
    cache = json.loads(DYNAMO_CACHE.read_text()) if DYNAMO_CACHE.exists() else {}
    if key in cache:
        return cache[key]
    out = subprocess.run(
        [python, "-c", DYNAMO_SCRIPT, args.trace, mode, str(speedup), str(args.blocks), str(args.workers)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if out.returncode != 0:
        print(out.stderr[-2000:], file=sys.stderr)
        return None
    got = json.loads(out.stdout.strip().splitlines()[-1])
    cache = json.loads(DYNAMO_CACHE.read_text()) if DYNAMO_CACHE.exists() else {}
    cache[key] = got
    DYNAMO_CACHE.write_text(json.dumps(cache))
    return got


def find_speedup(records, hasher, args) -> float:
    """Lowest speed-up (0.5 steps from ``--search-from``) where round-robin's TTFT p99 >= 5 s."""
    s = args.search_from
    while True:
        rr = run_ours(records, hasher, s, "round-robin", args)
        print(f"  x{s}: round-robin TTFT p99 {rr['ttft_p99_ms']:,.0f} ms", file=sys.stderr)
        if rr["ttft_p99_ms"] >= 5000:
            return s
        s += 0.5


def row(name: str, r: dict, upper: float, pooled: float) -> str:
    rejected = r.get("num_rejected")
    return (
        f"| {name} | {r['hit_ratio']:.3f} | {r['hit_ratio'] / pooled:.0%} | "
        f"{r['hit_ratio'] / upper:.0%} | "
        f"{r['ttft_p50_ms']:,.0f} / {r['ttft_p99_ms']:,.0f} | "
        f"{r['itl_p50_ms']:.1f} / {r['itl_p99_ms']:.1f} | {r['requests_per_s']:.2f} | "
        f"{'–' if rejected is None else rejected} | "
        f"{r.get('inflight_imbalance', float('nan')):.2f} | {r['wall_s']:.1f} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=TRACE)
    ap.add_argument("--workload", choices=("trace", "agent", "rag"), default="trace")
    ap.add_argument("--agent-sessions", type=int, default=AgentSpec.num_sessions)
    ap.add_argument("--agent-seed", type=int, default=0, help="the agent or rag workload's seed")
    ap.add_argument("--rag-sessions", type=int, default=RagSpec.num_sessions)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument(
        "--blocks",
        type=int,
        default=None,
        help="blocks of 64 tokens per worker (default 61,000; agent: distinct / 12)",
    )
    ap.add_argument("--speedup", type=float, default=None)
    ap.add_argument("--speedups", default=None, help="comma-separated arrival speed-ups")
    ap.add_argument("--search-from", type=float, default=6.5)
    ap.add_argument("--policies", default="kv,round-robin,least-loaded,power-of-two,random")
    ap.add_argument(
        "--max-queue-wait",
        type=float,
        default=0.0,
        help="RouterConfig.max_queue_wait_s (0: the queue is bounded by count only)",
    )
    ap.add_argument(
        "--cost",
        default="",
        help="kv cost fields to change from their defaults, e.g. stall_weight=0,backlog_charge=off",
    )
    ap.add_argument("--dynamo-python", default="/tmp/dynamo-venv/bin/python")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    t0 = time.perf_counter()
    if args.workload == "agent":
        records = agent_records(AgentSpec(num_sessions=args.agent_sessions, seed=args.agent_seed))
        args.trace = f"/tmp/agent_s{args.agent_sessions}_seed{args.agent_seed}.jsonl"
        write_mooncake(records, args.trace)
    elif args.workload == "rag":
        records = rag_records(RagSpec(num_sessions=args.rag_sessions, seed=args.agent_seed))
        args.trace = f"/tmp/rag_s{args.rag_sessions}_seed{args.agent_seed}.jsonl"
        write_mooncake(records, args.trace)
    else:
        records = load_mooncake(args.trace)
    distinct = len({h for r in records for h in r.hash_ids})
    if args.blocks is None:
        args.blocks = 61_000 if args.workload == "trace" else distinct * TRACE_BLOCK_SIZE // 64 // 12
    hasher = TraceHasher(64)
    reqs = mooncake_requests(records, block_size=64, hasher=hasher)
    from interlock.sim.bounds import cache_bounds

    upper, pooled = cache_bounds(reqs, 64, args.workers * args.blocks)
    print(
        f"{args.trace}: {len(records)} requests, {distinct:,} distinct 512-token blocks; caches "
        f"{args.workers} x {args.blocks:,} x 64 = {args.workers * args.blocks * 64 / (distinct * 512):.0%} "
        f"of them; loaded and hashed in {time.perf_counter() - t0:.1f} s",
        file=sys.stderr,
    )
    if args.speedups:
        speedups = [float(x) for x in args.speedups.split(",")]
    else:
        speedups = [args.speedup or find_speedup(records, hasher, args)]
    out = {}
    for speedup in speedups:
        results: dict[str, dict] = {}
        for pol in args.policies.split(","):
            results[f"interlock {pol}"] = run_ours(records, hasher, speedup, pol, args)
        for mode in ("kv_router", "round_robin"):
            got = run_dynamo(args.dynamo_python, speedup, mode, args)
            if got is not None:
                results[f"dynamo 1.6.1 {mode}"] = got
        print(
            f"\n{args.workload} x{speedup}: {len(records)} requests, {args.workers} workers x "
            f"{args.blocks:,} blocks of 64; pooled-cache bound {pooled:.3f}, infinite-cache "
            f"bound {upper:.3f}\n"
        )
        print(
            "| router | hit ratio | of pooled | of infinite | TTFT p50 / p99 ms | ITL p50 / p99 ms "
            "| req/s | rejected | in-flight max/mean | replay wall s |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|")
        for name, r in results.items():
            print(row(name, r, upper, pooled), flush=True)
        out[str(speedup)] = results
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "workload": args.workload,
                    "trace": args.trace,
                    "blocks": args.blocks,
                    "upper_bound": upper,
                    "pooled_bound": pooled,
                    "results": out,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
