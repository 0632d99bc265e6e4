"""Herding behind one shared system prompt, in virtual time: the busiest worker's in-flight
requests over the mean, and the hit ratio against its bound, for the ``kv`` policy with and
without KV events (the workload of ``tests/sim/test_replay.py``).

    PYTHONPATH=. .venv/bin/python benchmarks/herding.py --rates 20,60,120 [--cost stall_weight=0] [--seeds 1,2,3]

``--seeds``: the workload drawn again with other seeds (the benchmark's figure is seed 1's).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from interlock.router import RouterConfig
from interlock.sim import ReplayConfig, SharedPrefixSpec, replay, shared_prefix_requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
from replay_compare import parse_cost  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="20,60,120", help="arrival rates, requests/s")
    ap.add_argument("--requests", type=int, default=1500)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--num-blocks", type=int, default=4000)
    ap.add_argument("--cost", default="", help="kv cost fields to change, e.g. stall_weight=0")
    ap.add_argument("--seeds", default="1", help="workload seeds (the benchmark's figure: 1)")
    args = ap.parse_args()
    cost = parse_cost(args.cost)
    print(
        "| req/s | seed | KV events | busiest / mean in flight | hit ratio | bound | TTFT p50 / p99 ms | ITL p99 ms |"
    )
    print("|---|---|---|---|---|---|---|---|")
    runs = [(float(r), int(seed)) for r in args.rates.split(",") for seed in args.seeds.split(",")]
    for rate, seed in runs:
        spec = SharedPrefixSpec(
            num_requests=args.requests,
            num_groups=1,
            system_tokens=2000,
            suffix_tokens=200,
            output_tokens=100,
            rate=rate,
            block_size=64,
            seed=seed,
        )
        requests = shared_prefix_requests(spec)
        for events in (True, False):
            config = ReplayConfig(
                num_workers=args.workers,
                num_blocks=args.num_blocks,
                router=RouterConfig(policy="kv", seed=0, cost=cost),
                publish_events=events,
            )
            rep = replay(requests, config)
            print(
                f"| {rate:g} | {seed} | {'yes' if events else 'no'} | {rep.inflight_imbalance:.2f} | {rep.hit_ratio:.3f}"
                f" | {rep.upper_bound:.3f} | {rep.ttft_p50_ms:.1f} / {rep.ttft_p99_ms:.1f} | {rep.itl_p99_ms:.1f} |"
            )


if __name__ == "__main__":
    main()
