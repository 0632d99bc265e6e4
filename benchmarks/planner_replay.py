"""The planner in virtual time against fixed fleets, on the Mooncake conversation trace with its
arrival rate following a curve (issue 13's acceptance replays).

    .venv/bin/python benchmarks/planner_replay.py --profile mock_profile.json

Every run is ``interlock.sim.replay`` with the same requests: the trace at ``--speedup``, then
multiplied by one period of a diurnal curve (``--min``..``--max``, the period fitted so the trace
spans exactly one cycle) or by ``--curve``. Reported per run: SLA attainment (share of requests
with TTFT <= ``--ttft-slo-ms`` and mean inter-token time <= ``--itl-slo-ms``), worker-seconds,
TTFT p50/p99. Then the two comparisons the issue asks for:

* the fixed fleet *sized for the peak*: the smallest fixed size whose attainment is within
  0.5 points of the best fixed size's; the planner should match its attainment with >= 30%
  fewer worker-seconds;
* the fixed fleet with the planner's worker-seconds (rounded to whole workers): the planner
  should have the higher attainment.

And a bound no planner can beat here (``--bound-bucket-s``): an offline planner that knows the
whole trace, picks any of the fixed sizes run for each bucket of arrivals, and changes size
instantly and for free (no start-up, no cold cache). Each bucket's misses at each size come
from the fixed runs; a small dynamic programme finds the fewest worker-seconds whose misses
stay within a budget (the peak fleet's, and each planner's own).

``--causal`` replays that bound's sizes as a fleet schedule (``ReplayConfig.fleet_schedule``):
each bucket's size from the bucket's start, added workers joining ``--startup-s`` later. It
knows the size each moment needs but only from that moment on (no foresight, start-up paid):
at a step, the most any planner can reach. ``--schedule 0:3,300:9`` replays a schedule given by
hand the same way.

``--tile K`` runs the trace K times back to back (block hashes salted per copy, so copies share
no cache) under one period of the curve: a K times slower day with the same trough and peak.
``--overlay K`` lays K salted copies over the same span, each rotated by 1/K of it: K times the
users on the same day (a fleet K times larger), the hit ratio about the trace's.

The SLA planner needs ``--profile`` (``interlock profile --runner mock -o FILE``, whose defaults
match the replay's workers). Figures are deterministic; wall times depend on the machine's load.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace

from interlock.mooncake import load_mooncake
from interlock.names import STALL_OVER
from interlock.planner import PlannerConfig, RoleBounds, load_profile
from interlock.router import RouterConfig
from interlock.router.cost import CostParams
from interlock.sim import ReplayConfig, ReplayReport, TraceHasher, mooncake_requests, replay
from interlock.sim.frontier import misses, offline_bound
from interlock.sim.rate import diurnal, overlay, parse_curve, tile, warp

TRACE = "/work/shared/traces/mooncake_conversation_trace.jsonl"


def row(name: str, r: ReplayReport) -> str:
    return (
        f"{name:<26} {100 * r.sla_attainment:>6.2f}% {r.worker_seconds:>9,.0f} "
        f"{r.mean_workers:>6.2f} {r.ttft_p50_ms:>7,.0f} {r.ttft_p99_ms:>8,.0f} "
        f"{r.itl_p50_ms:>6.1f} {100 * r.hit_ratio:>5.1f}% {len(r.planner_decisions):>4} {r.wall_s:>6.1f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default=TRACE)
    ap.add_argument("--speedup", type=float, default=4.0)
    ap.add_argument("--min", type=float, default=0.25, help="diurnal trough multiplier")
    ap.add_argument("--max", type=float, default=1.5, help="diurnal peak multiplier")
    ap.add_argument("--curve", default=None, help="a rate curve instead (steps:... or diurnal:...)")
    ap.add_argument("--ttft-slo-ms", type=float, default=2000.0)
    ap.add_argument("--itl-slo-ms", type=float, default=50.0)
    ap.add_argument("--min-workers", type=int, default=2, help="the planner's floor, and where it starts")
    ap.add_argument("--max-workers", type=int, default=10)
    ap.add_argument(
        "--start-workers",
        type=int,
        default=0,
        help="where the planners start (0: --min-workers; fixed fleets have their size from the start)",
    )
    ap.add_argument(
        "--backlog-high-s",
        type=float,
        default=PlannerConfig.backlog_high_s,
        help="reactive: grow above this much queued prefill per worker",
    )
    ap.add_argument("--backlog-low-s", type=float, default=PlannerConfig.backlog_low_s)
    ap.add_argument("--window-s", type=float, default=60.0)
    ap.add_argument(
        "--grow-window-s",
        type=float,
        default=0.0,
        help="after an add, a further add this soon (0: --window-s)",
    )
    ap.add_argument(
        "--shrink-window-s",
        type=float,
        default=0.0,
        help="after a removal, a further removal this soon (0: --window-s)",
    )
    ap.add_argument(
        "--max-changes",
        type=int,
        default=PlannerConfig.max_changes,
        help="changes allowed per 600 s (0: max(6, --max-workers))",
    )
    ap.add_argument(
        "--step-share",
        type=float,
        default=PlannerConfig.step_share,
        help="one step moves at most this share of the pool (0: one worker)",
    )
    ap.add_argument(
        "--surge",
        type=float,
        default=PlannerConfig.surge,
        help="sla: arrivals this many times their level are a surge (0: off)",
    )
    ap.add_argument(
        "--headroom", type=float, default=PlannerConfig.headroom, help="sla: spare kept when shrinking"
    )
    ap.add_argument("--attainment", type=float, default=PlannerConfig.attainment, help="sla: target share")
    ap.add_argument("--startup-s", type=float, default=30.0)
    ap.add_argument("--ramp-s", type=float, default=60.0)
    ap.add_argument("--profile", default=None, help="capability profile (runs the sla planner)")
    ap.add_argument("--policies", default="reactive,sla", help='planners to run ("": none)')
    ap.add_argument("--fixed", default=None, help="fixed sizes to run (default 2..max-workers)")
    ap.add_argument(
        "--fixed-from",
        default=None,
        help="take the fixed rows from an earlier run's --json (same trace and flags) instead",
    )
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--tile", type=int, default=1, help="the trace this many times back to back")
    ap.add_argument(
        "--overlay", type=int, default=1, help="this many salted, rotated copies over the same span"
    )
    ap.add_argument("--horizon-s", type=float, default=PlannerConfig.horizon_s, help="sla: forecast horizon")
    ap.add_argument("--tail", action="store_true", help="sla: the tail model (planner.tail)")
    ap.add_argument(
        "--bound-bucket-s",
        type=float,
        default=25.0,
        help="offline bound: one fixed size per bucket of this many seconds (0: no bound)",
    )
    ap.add_argument(
        "--causal",
        action="store_true",
        help="replay the offline bound's sizes (within the peak fleet's misses) with start-up paid",
    )
    ap.add_argument("--schedule", default=None, help="replay this fleet schedule: FROM_S:SIZE,...")
    ap.add_argument(
        "--stall-over",
        choices=STALL_OVER,
        default=CostParams.stall_over,
        help="the kv cost's stall counts these requests (CostParams.stall_over)",
    )
    ap.add_argument("--json", default=None, help="also write every report here")
    args = ap.parse_args()

    t0 = time.perf_counter()
    records = load_mooncake(args.trace, limit=args.limit)
    base = tile(mooncake_requests(records, speedup=args.speedup, hasher=TraceHasher(64, 512)), args.tile)
    base = overlay(base, args.overlay)
    if args.curve:
        curve_text = args.curve
        requests = warp(base, parse_curve(args.curve))
    else:
        span = max(r.arrival_s for r in base)
        period = span / ((args.min + args.max) / 2)
        curve_text = f"diurnal:period={period:.0f},min={args.min:g},max={args.max:g}"
        requests = warp(base, diurnal(period, args.min, args.max))
    print(
        f"{len(requests)} requests, x{args.speedup:g}{f' tiled x{args.tile}' if args.tile > 1 else ''}"
        f"{f' overlaid x{args.overlay}' if args.overlay > 1 else ''} "
        f"then {curve_text}; SLO TTFT <= "
        f"{args.ttft_slo_ms:g} ms, ITL <= {args.itl_slo_ms:g} ms; trace ready in "
        f"{time.perf_counter() - t0:.0f} s",
        flush=True,
    )
    cfg = ReplayConfig(
        router=RouterConfig(policy="kv", block_size=64, seed=0, cost=CostParams(stall_over=args.stall_over)),
        ttft_slo_ms=args.ttft_slo_ms,
        itl_slo_ms=args.itl_slo_ms,
        startup_s=args.startup_s,
    )
    print(
        f"{'run':<26} {'SLA':>7} {'worker-s':>9} {'mean':>6} {'TTFT50':>7} {'TTFT99':>8} "
        f"{'ITL50':>6} {'hit':>6} {'dec':>4} {'wall':>6}",
        flush=True,
    )
    reports: dict[str, ReplayReport] = {}
    planner = PlannerConfig(
        both=RoleBounds(args.min_workers, args.max_workers),
        window_s=args.window_s,
        grow_window_s=args.grow_window_s,
        shrink_window_s=args.shrink_window_s,
        ramp_s=args.ramp_s,
        ttft_ms=args.ttft_slo_ms,
        itl_ms=args.itl_slo_ms,
        backlog_high_s=args.backlog_high_s,
        backlog_low_s=args.backlog_low_s,
        headroom=args.headroom,
        max_changes=args.max_changes,
        step_share=args.step_share,
        surge=args.surge,
        attainment=args.attainment,
        horizon_s=args.horizon_s,
        tail=args.tail,
    )
    for policy in [p for p in args.policies.split(",") if p]:
        if policy == "sla" and not args.profile:
            continue
        pc = replace(planner, policy=policy, profile=args.profile if policy == "sla" else None)
        prof = load_profile(args.profile) if policy == "sla" else None
        start = args.start_workers or args.min_workers
        r = replay(requests, replace(cfg, num_workers=start, planner=pc, profile=prof))
        reports[f"planner {policy}"] = r
        print(row(f"planner {policy}", r), flush=True)
    sizes = [int(x) for x in args.fixed.split(",")] if args.fixed else list(range(2, args.max_workers + 1))
    earlier = {}
    if args.fixed_from:
        with open(args.fixed_from) as f:
            earlier = {k: v for k, v in json.load(f).items() if k.startswith("fixed")}
        sizes = sorted(int(k.split()[1]) for k in earlier)
    for n in sizes:
        if f"fixed {n}" in earlier:
            d = earlier[f"fixed {n}"]
            r = ReplayReport(
                **{**d, "planner_decisions": (), "missed_arrivals_s": tuple(d["missed_arrivals_s"])}
            )
        else:
            r = replay(requests, replace(cfg, num_workers=n))
        reports[f"fixed {n}"] = r
        print(row(f"fixed {n}", r), flush=True)
    fixed = {int(k.split()[1]): v for k, v in reports.items() if k.startswith("fixed")}
    best = max(v.sla_attainment for v in fixed.values())
    peak_n = min(n for n, v in fixed.items() if v.sla_attainment >= best - 0.005)
    peak = fixed[peak_n]
    print(
        f"\nfixed fleet sized for the peak: {peak_n} workers ({100 * peak.sla_attainment:.1f}%, "
        f"{peak.worker_seconds:,.0f} worker-s)"
    )
    for name, r in reports.items():
        if not name.startswith("planner"):
            continue
        lo, hi = int(r.mean_workers), int(r.mean_workers) + 1
        saving = 1 - r.worker_seconds / peak.worker_seconds
        around = ", ".join(f"fixed {n} {100 * fixed[n].sla_attainment:.1f}%" for n in (lo, hi) if n in fixed)
        print(
            f"{name}: attainment {100 * r.sla_attainment:.1f}% vs {100 * peak.sla_attainment:.1f}% "
            f"(peak fleet) with {100 * saving:.0f}% fewer worker-seconds; its mean of "
            f"{r.mean_workers:.2f} workers lies between {around or 'sizes not run'}"
        )
        for rec in r.planner_decisions:
            print(f"    {rec.line()}")
    scheduled: dict[str, tuple[tuple[float, int], ...]] = {}
    if args.bound_bucket_s > 0:
        span = max(r.arrival_s for r in requests)
        budgets = {"the peak fleet's misses": peak}
        budgets.update({k: v for k, v in reports.items() if k.startswith("planner")})
        for what, r in budgets.items():
            ws, sizes_used = offline_bound(fixed, span, args.bound_bucket_s, misses(r))
            print(
                f"offline bound within {what} ({100 * r.sla_attainment:.2f}%): {ws:,.0f} worker-s "
                f"({100 * (1 - ws / peak.worker_seconds):.0f}% fewer than the peak fleet); "
                f"sizes per {args.bound_bucket_s:g} s: {' '.join(map(str, sizes_used))}"
            )
            if args.causal and r is peak and sizes_used:
                sched = [(i * args.bound_bucket_s, n) for i, n in enumerate(sizes_used)]
                scheduled["causal bound"] = tuple(
                    p for i, p in enumerate(sched) if i == 0 or p[1] != sched[i - 1][1]
                )
    if args.schedule:
        pieces = [p.split(":") for p in args.schedule.split(",")]
        scheduled[f"schedule {args.schedule}"] = tuple((float(t), int(n)) for t, n in pieces)
    for name, sched in scheduled.items():
        r = replay(requests, replace(cfg, num_workers=sched[0][1], planner=planner, fleet_schedule=sched))
        reports[name] = r
        print(row(name[:26], r), flush=True)
        print(
            f"    {100 * (1 - r.worker_seconds / peak.worker_seconds):.0f}% fewer worker-s than the peak "
            f"fleet; schedule {' '.join(f'{t:g}:{n}' for t, n in sched)}",
            flush=True,
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({k: v.to_dict() for k, v in reports.items()}, f, indent=1)


if __name__ == "__main__":
    main()
