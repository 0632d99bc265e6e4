"""Trace replay, policy against policy, and against Dynamo 1.6.1's router on the same trace.

Setup (as in /work/shared/anchors/dynamo.md): the Mooncake conversation trace, 8 simulated
workers of 61,000 blocks of 64 tokens (together about a third of the trace's distinct blocks),
the mock timing model (Dynamo's polynomial fit), 8,192 batched tokens and 256 sequences per
step, chunked prefill and prefix caching on. Arrivals are sped up until round-robin's TTFT p99
reaches 5 s (``--speedup`` to fix it instead). Interlock's policies run in ``interlock.sim``;
Dynamo's run through ``dynamo.replay.run_trace_replay`` in its own virtual environment
(``--dynamo-python``), skipped if that is missing.

    .venv/bin/python benchmarks/replay_compare.py [--speedup 7.5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from interlock.mooncake import load_mooncake
from interlock.router import RouterConfig
from interlock.sim import ReplayConfig, TraceHasher, mooncake_requests, replay

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


def run_ours(records, hasher: TraceHasher, speedup: float, policy: str, args) -> dict:
    reqs = mooncake_requests(records, block_size=64, speedup=speedup, hasher=hasher)
    cfg = ReplayConfig(num_workers=args.workers, num_blocks=args.blocks,
                       router=RouterConfig(policy=policy, block_size=64, seed=0))
    return replay(reqs, cfg).to_dict()


def run_dynamo(python: str, speedup: float, mode: str, args) -> dict | None:
    if not Path(python).exists():
        return None
    out = subprocess.run([python, "-c", DYNAMO_SCRIPT, args.trace, mode, str(speedup),
                          str(args.blocks), str(args.workers)],
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        print(out.stderr[-2000:], file=sys.stderr)
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def find_speedup(records, hasher, args) -> float:
    """Lowest speed-up (0.5 steps from ``--search-from``) where round-robin's TTFT p99 >= 5 s."""
    s = args.search_from
    while True:
        rr = run_ours(records, hasher, s, "round-robin", args)
        print(f"  x{s}: round-robin TTFT p99 {rr['ttft_p99_ms']:,.0f} ms", file=sys.stderr)
        if rr["ttft_p99_ms"] >= 5000:
            return s
        s += 0.5


def row(name: str, r: dict, upper: float) -> str:
    return (f"| {name} | {r['hit_ratio']:.3f} | {r['hit_ratio'] / upper:.0%} | "
            f"{r['ttft_p50_ms']:,.0f} / {r['ttft_p99_ms']:,.0f} | "
            f"{r['itl_p50_ms']:.1f} / {r['itl_p99_ms']:.1f} | {r['requests_per_s']:.2f} | "
            f"{r.get('inflight_imbalance', float('nan')):.2f} | {r['wall_s']:.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=TRACE)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--blocks", type=int, default=61_000)
    ap.add_argument("--speedup", type=float, default=None)
    ap.add_argument("--search-from", type=float, default=6.5)
    ap.add_argument("--policies", default="kv,round-robin,least-loaded,power-of-two,random")
    ap.add_argument("--dynamo-python", default="/tmp/dynamo-venv/bin/python")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    t0 = time.perf_counter()
    records = load_mooncake(args.trace)
    hasher = TraceHasher(64)
    reqs = mooncake_requests(records, block_size=64, hasher=hasher)
    from interlock.sim import infinite_cache_hit_ratio

    upper = infinite_cache_hit_ratio(reqs, 64)
    distinct = len({h for r in records for h in r.hash_ids})
    print(f"trace: {len(records)} requests, {distinct:,} distinct 512-token blocks; caches "
          f"{args.workers} x {args.blocks:,} x 64 = {args.workers * args.blocks * 64 / (distinct * 512):.0%} "
          f"of them; loaded and hashed in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    speedup = args.speedup or find_speedup(records, hasher, args)
    results: dict[str, dict] = {}
    for pol in args.policies.split(","):
        results[f"interlock {pol}"] = run_ours(records, hasher, speedup, pol, args)
    for mode in ("kv_router", "round_robin"):
        got = run_dynamo(args.dynamo_python, speedup, mode, args)
        if got is not None:
            results[f"dynamo 1.6.1 {mode}"] = got
    print(f"\nConversation trace, x{speedup} arrivals, {args.workers} workers x {args.blocks:,} "
          f"blocks of 64; infinite-cache bound {upper:.3f}\n")
    print("| router | hit ratio | of bound | TTFT p50 / p99 ms | ITL p50 / p99 ms | req/s "
          "| in-flight max/mean | replay wall s |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        print(row(name, r, upper))
    kv = results.get("interlock kv")
    if kv:
        for other in ("interlock round-robin", "interlock least-loaded", "dynamo 1.6.1 kv_router"):
            if other in results:
                print(f"\nTTFT p99 {other} / kv: {results[other]['ttft_p99_ms'] / kv['ttft_p99_ms']:.2f}x",
                      end="")
        print(f"\nkv hit ratio / bound: {kv['hit_ratio'] / upper:.1%}")
    if args.json:
        Path(args.json).write_text(json.dumps({"speedup": speedup, "upper_bound": upper,
                                               "results": results}, indent=2))


if __name__ == "__main__":
    main()
