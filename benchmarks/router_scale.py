"""The kv router on a fleet K times larger serving K times the users (planner replays'
``--overlay K``), against K fleets of the small size each serving one copy alone.

    PYTHONPATH=. .venv/bin/python benchmarks/router_scale.py --overlay 4 --workers 7 [--stall-over inflight]

The requests are ``planner_replay.py``'s at its defaults and ``--min 0.3`` (the trace at x4,
K salted copies rotated by 1/K of the span, one diurnal period over it). Runs, each a replay
in virtual time with the ``kv`` router:

* ``shared``: K x ``--workers`` workers serve all K copies (what ``--overlay K --fixed`` runs);
* ``copy i``: ``--workers`` workers serve copy i alone, at the arrival times it has in the
  overlay (K sub-fleets, each copy on its own: what the shared fleet could at least match).

Per run: SLA attainment (TTFT <= 2 s and mean inter-token time <= 50 ms), the misses split into
TTFT-only and ITL-only, hit ratio and pooled-cache bound, TTFT p99, and how the work spread over
the workers: each worker's computed prefill tokens (prompt less hits) and output tokens over the
fleet's mean (max and coefficient of variation), and the ITL misses of the worker that computed
the most. The per-request figures need the simulator's requests, which the replay report does
not carry, so the driver is subclassed here (as ``ttft_tail.py`` does).
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import numpy as np

from interlock.mooncake import load_mooncake
from interlock.names import STALL_OVER
from interlock.router import RouterConfig
from interlock.router.cost import CostParams
from interlock.sim import ReplayConfig, TraceHasher, mooncake_requests
from interlock.sim.bounds import pooled_cache_hit_ratio
from interlock.sim.rate import diurnal, overlay, warp
from interlock.sim.replay import _Driver
from interlock.sim.trace import SimRequest

TRACE = "/work/shared/traces/mooncake_conversation_trace.jsonl"
TTFT_S, ITL_S = 2.0, 0.05


def copy_of(request_id: str) -> int:
    return int(request_id.split("#")[1]) if "#" in request_id else 0


def run(name: str, reqs: list[SimRequest], workers: int, stall_over: str) -> None:
    cfg = ReplayConfig(
        num_workers=workers,
        router=RouterConfig(policy="kv", block_size=64, seed=0, cost=CostParams(stall_over=stall_over)),
    )
    t0 = time.perf_counter()
    drv = _Driver(cfg)
    drv.run(reqs)
    wall = time.perf_counter() - t0
    where = {d.request_id: d.worker_id for d in drv.decisions}
    per: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])  # computed, output, ITL misses
    ttft_miss = itl_miss = met = prompt = hit = 0
    ttfts = []
    for s in drv.done:
        ttft = s.first_token_s - s.req.arrival_s
        out = s.req.output_tokens
        slow = out > 1 and (s.finish_s - s.first_token_s) / (out - 1) > ITL_S
        ttfts.append(ttft)
        w = per[where[s.req.request_id]]
        w[0] += s.req.prompt_tokens - s.hit_tokens
        w[1] += out
        prompt, hit = prompt + s.req.prompt_tokens, hit + s.hit_tokens
        if ttft > TTFT_S:
            ttft_miss += 1
        elif slow:
            itl_miss += 1
            w[2] += 1
        else:
            met += 1
    computed, outputs, slow_ = (np.asarray(v, dtype=float) for v in zip(*per.values(), strict=True))
    top = int(computed.argmax())
    pooled = pooled_cache_hit_ratio(reqs, cfg.block_size, workers * cfg.num_blocks)
    print(
        f"{name:<9} {workers:>3} {100 * met / len(reqs):6.2f}% {ttft_miss:>5} {itl_miss:>5} "
        f"{100 * hit / prompt:6.2f}% {100 * pooled:6.2f}% {1000 * np.percentile(ttfts, 99):7,.0f} "
        f"{computed.max() / computed.mean():5.2f} {computed.std() / computed.mean():5.3f} "
        f"{outputs.std() / outputs.mean():5.3f} {slow_[top]:>4.0f}/{slow_.mean():<5.1f} {wall:5.0f}",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default=TRACE)
    ap.add_argument("--overlay", type=int, default=4, help="K: copies of the trace over its span")
    ap.add_argument("--workers", type=int, default=7, help="workers per copy")
    ap.add_argument("--min", type=float, default=0.3, help="diurnal trough multiplier")
    ap.add_argument("--max", type=float, default=1.5, help="diurnal peak multiplier")
    ap.add_argument("--stall-over", choices=STALL_OVER, default=CostParams.stall_over)
    ap.add_argument("--runs", default="shared,copies", help="shared, copies (each copy alone), or both")
    args = ap.parse_args()
    runs = set(args.runs.split(","))
    if not runs <= {"shared", "copies"}:
        ap.error(f"--runs takes shared and/or copies, not {args.runs!r}")

    base = mooncake_requests(load_mooncake(args.trace), speedup=4.0, hasher=TraceHasher(64, 512))
    base = overlay(base, args.overlay)
    period = max(r.arrival_s for r in base) / ((args.min + args.max) / 2)
    reqs = warp(base, diurnal(period, args.min, args.max))
    print(
        f"{len(reqs)} requests (x4, overlay {args.overlay}, diurnal {args.min:g}..{args.max:g}); "
        f"stall over {args.stall_over}\n"
        f"{'run':<9} {'wkr':>3} {'SLA':>7} {'TTFT':>5} {'ITL':>5} {'hit':>7} {'pooled':>7} "
        f"{'TTFT99':>7} {'pmax':>5} {'p_cv':>5} {'o_cv':>5} {'itl top/mean':>10} {'wall':>5}",
        flush=True,
    )
    if "shared" in runs:
        run("shared", reqs, args.overlay * args.workers, args.stall_over)
    if "copies" in runs:
        for i in range(args.overlay):
            run(f"copy {i}", [r for r in reqs if copy_of(r.request_id) == i], args.workers, args.stall_over)


if __name__ == "__main__":
    main()
