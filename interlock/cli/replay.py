"""``interlock replay TRACE``: replay a Mooncake-format trace in virtual time against simulated
workers behind the router, and print the report.

Offline only for now: replay against running worker processes (online) is not implemented.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from interlock.cli import flags
from interlock.mooncake import load_mooncake
from interlock.router import POLICIES, RouterConfig
from interlock.router.cost import CostParams
from interlock.sim import ReplayConfig, TraceHasher, mooncake_requests, replay


def build_parser() -> argparse.ArgumentParser:
    p = flags.parser("interlock replay", __doc__)
    p.add_argument("trace", help="Mooncake-format JSONL trace")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--policy", choices=POLICIES, default="kv")
    p.add_argument("--speedup", type=float, default=1.0, help="arrival speed-up: divide inter-arrival times by this")
    p.add_argument("--blocks-per-worker", type=int, default=61_000)
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--trace-block-size", type=int, default=512)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--engine-speedup", type=float, default=1.0, help="divide step times by this")
    p.add_argument("--no-kv-events", action="store_true",
                   help="workers publish no KV events (router predicts their caches)")
    p.add_argument("--queue-capacity", type=int, default=RouterConfig.queue_capacity,
                   help="router admission queue; past it requests are rejected (503), and counted")
    p.add_argument("--queue-depth-threshold", type=int, default=0,
                   help="a worker with more requests waiting is busy for routing (0: never)")
    p.add_argument("--miss-weight", type=float, default=CostParams.miss_weight)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--limit", type=int, default=None, help="replay only the first N requests")
    p.add_argument("--backend", choices=("fast", "engine"), default="fast",
                   help="fast: the event-driven worker model; engine: the real EngineCore with "
                   "the mock runner (exact, one Python step per token: small traces only)")
    p.add_argument("--host-kv-blocks", type=int, default=0,
                   help="host-memory KV tier per host, shared by its workers (0: none; fast backend)")
    p.add_argument("--workers-per-host", type=int, default=8)
    p.add_argument("--host-load-ms", type=float, default=0.1, help="modelled ms to load one block from host")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    return flags.apply_environment(p)


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    records = load_mooncake(args.trace, limit=args.limit)
    hasher = TraceHasher(args.block_size, args.trace_block_size)
    requests = mooncake_requests(records, block_size=args.block_size, speedup=args.speedup,
                                 hasher=hasher, with_tokens=args.backend == "engine")
    cost = replace(CostParams(), miss_weight=args.miss_weight, temperature=args.temperature)
    cfg = ReplayConfig(
        num_workers=args.workers, num_blocks=args.blocks_per_worker, block_size=args.block_size,
        max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs,
        engine_speedup=args.engine_speedup, publish_events=not args.no_kv_events,
        backend=args.backend, queue_depth_threshold=args.queue_depth_threshold,
        host_kv_blocks=args.host_kv_blocks, workers_per_host=args.workers_per_host,
        host_load_s_per_block=args.host_load_ms / 1000.0,
        router=RouterConfig(policy=args.policy, block_size=args.block_size, cost=cost,
                            queue_capacity=args.queue_capacity, seed=0),
    )
    report = replay(requests, cfg)
    if args.json:
        json.dump(report.to_dict(), sys.stdout, indent=2)
        print()
    else:
        print(f"trace {args.trace}: {len(requests)} requests, arrivals x{args.speedup}, "
              f"{args.workers} workers x {args.blocks_per_worker} blocks of {args.block_size}")
        print(report.render())
    return 0
