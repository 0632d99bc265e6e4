"""How well the planner's tail model (``interlock.planner.tail``) predicts the misses of the
replay simulator: fixed fleets on the diurnal Mooncake replay of ``planner_replay.py``, the
model run on the same requests (with the router's cached-token estimates of that run).

    .venv/bin/python benchmarks/tail_check.py --profile mock_profile.json --sizes 5,6,7,8,9

Per size: TTFT and ITL misses, simulated and predicted, over the whole trace and per bucket.
Uses the replay's driver directly (``sim.replay._Driver``): the report does not carry each
request's predicted cached tokens, which the model needs.
"""

from __future__ import annotations

import argparse

from interlock.mooncake import load_mooncake
from interlock.planner import load_profile
from interlock.planner.tail import Job, StepTimes, miss_share
from interlock.router import RouterConfig
from interlock.sim import ReplayConfig, TraceHasher, mooncake_requests
from interlock.sim.rate import diurnal, warp
from interlock.sim.replay import _Driver

TRACE = "/work/shared/traces/mooncake_conversation_trace.jsonl"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default=TRACE)
    ap.add_argument("--profile", required=True)
    ap.add_argument("--speedup", type=float, default=4.0)
    ap.add_argument("--min", type=float, default=0.3)
    ap.add_argument("--max", type=float, default=1.5)
    ap.add_argument("--sizes", default="5,6,7,8,9")
    ap.add_argument("--bucket-s", type=float, default=100.0)
    ap.add_argument("--ttft-ms", type=float, default=2000.0)
    ap.add_argument("--itl-ms", type=float, default=50.0)
    args = ap.parse_args()
    prof = load_profile(args.profile)
    base = mooncake_requests(load_mooncake(args.trace), speedup=args.speedup, hasher=TraceHasher(64, 512))
    span = max(r.arrival_s for r in base)
    reqs = sorted(
        warp(base, diurnal(span / ((args.min + args.max) / 2), args.min, args.max)), key=lambda r: r.arrival_s
    )
    ttft, itl = args.ttft_ms / 1000.0, args.itl_ms / 1000.0
    steps = StepTimes(decode_s=0.009, chunk_s=prof.prefill_s(prof.chunk_tokens))
    nb = int(reqs[-1].arrival_s // args.bucket_s) + 1
    print(
        f"{len(reqs)} requests; decode step {1000 * steps.decode_s:g} ms, chunk {1000 * steps.chunk_s:.0f} ms"
    )
    for n in (int(x) for x in args.sizes.split(",")):
        drv = _Driver(ReplayConfig(router=RouterConfig(policy="kv", block_size=64, seed=0), num_workers=n))
        drv.run(reqs)
        cached = {d.request_id: d.cached_tokens for d in drv.decisions}
        sim_t, sim_i = [0] * nb, [0] * nb
        for s in drv.done:
            b = int(s.req.arrival_s // args.bucket_s)
            if s.first_token_s - s.req.arrival_s > ttft:
                sim_t[b] += 1
            elif s.req.output_tokens > 1 and (s.finish_s - s.first_token_s) / (s.req.output_tokens - 1) > itl:
                sim_i[b] += 1
        pred_t, pred_i = [0.0] * nb, [0.0] * nb
        for b in range(nb):
            jobs = []
            for r in reqs:
                if b * args.bucket_s <= r.arrival_s < (b + 1) * args.bucket_s:
                    u = max(r.prompt_tokens - cached.get(r.request_id, 0), 1)
                    jobs.append(
                        Job(r.arrival_s, prof.prefill_s(u), -(-u // prof.chunk_tokens), r.output_tokens)
                    )
            both = miss_share(jobs, n, steps, ttft, itl) * len(jobs)
            pred_t[b] = miss_share(jobs, n, steps, ttft, float("inf")) * len(jobs)
            pred_i[b] = both - pred_t[b]
        print(
            f"{n} workers: TTFT misses simulated {sum(sim_t)}, predicted {sum(pred_t):.0f}; "
            f"ITL misses simulated {sum(sim_i)}, predicted {sum(pred_i):.0f}"
        )
        print(
            "   per bucket (simulated/predicted TTFT, ITL): "
            + " ".join(
                f"{a}/{c:.0f},{b_}/{d:.0f}" for a, b_, c, d in zip(sim_t, sim_i, pred_t, pred_i, strict=True)
            )
        )


if __name__ == "__main__":
    main()
