"""Both planner policies over the family of load shapes (``interlock.sim.rate.FAMILY``: steps up
and down, spikes, ramps, shallow and deep days, a flash crowd) on two traces, against the
frontier of fixed fleets and the offline bound (issue 29).

    .venv/bin/interlock profile --runner mock -o mock_profile.json
    .venv/bin/python benchmarks/planner_shapes.py --profile mock_profile.json --jobs 2 --cache shapes/

Traces: ``conversation`` (Mooncake's conversation trace) and ``synthetic`` (our own: shared
system prompts, multi-turn sessions, Poisson starts; ``sim.synthetic``). Each shape spans
``--span-s``; the trace's arrivals are stretched so that all its requests arrive within that
span under the shape (its x1 level is the trace's rate times the span over the shape's
integral), so a shape changes when requests come, never which.

Per trace and shape, in virtual time (``sim.replay``, the mock worker model):

* fixed fleets of every size from ``--min-workers`` up (stopping one size after the first that
  reaches ``--frontier-stop``: larger fleets only cost more);
* the reactive and SLA planners, every planner key at its default (bounds
  ``--min-workers..--max-workers``), starting from the fleet the first ``--warm-s`` seconds
  need (the smallest fixed size within the target there: a planner that was running before
  the replay began);
* the offline bound (``sim.frontier``) within the misses the target allows;
* the causal bound: the offline bound within the misses of the cheapest fixed fleet reaching
  the target, its sizes replayed as a fleet schedule (``ReplayConfig.fleet_schedule``: each
  bucket's size from the bucket's start, added workers serving ``--startup-s`` later). It knows
  the size each moment needs but only from that moment on: where it cannot reach the fixed
  fleet's attainment, a planner without foresight reaches it only by keeping more workers
  than the bound (the SLA target at a step or a spike shorter than the start-up).
  ``--causal-lead S`` starts each size S seconds early (foresight), ``--causal-plus K`` keeps K
  workers more throughout: what it takes the bound's sizes to reach the fixed fleet.

Reported: attainment and worker-seconds for each policy; the cheapest fixed fleet reaching
``--target``; the attainment of the fixed fleet with the reactive planner's worker-seconds;
the offline bound. And the issue's targets, per shape: the SLA policy at least ``--target`` and
at least the cheapest fixed fleet reaching it, with at least ``--saving`` fewer worker-seconds;
the reactive policy never below the fixed fleet of the same worker-seconds.

Fixed replays do not depend on the planner: ``--cache DIR`` keeps them (one JSON per trace and
shape) and a later run replays the planners only. Figures are deterministic.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import multiprocessing
import os
import time
from dataclasses import replace
from typing import Any

from interlock.mooncake import load_mooncake
from interlock.planner import PlannerConfig, RoleBounds, load_profile
from interlock.router import RouterConfig
from interlock.sim import (
    ReplayConfig,
    ReplayReport,
    SharedPrefixSpec,
    SimRequest,
    TraceHasher,
    mooncake_requests,
    replay,
    shared_prefix_requests,
)
from interlock.sim.frontier import attainment_at, cheapest_reaching, misses, offline_bound
from interlock.sim.rate import FAMILY, parse_curve, warp

TRACE = "/work/shared/traces/mooncake_conversation_trace.jsonl"
GRID_S = 0.5


@functools.lru_cache(maxsize=2)
def base_trace(name: str, limit: int) -> tuple[SimRequest, ...]:
    if name == "conversation":
        records = load_mooncake(TRACE, limit=limit or None)
        return tuple(mooncake_requests(records, speedup=1.0, hasher=TraceHasher(64, 512)))
    if name == "synthetic":
        spec = SharedPrefixSpec(
            num_requests=limit or 12_000,
            num_groups=32,
            system_tokens=2000,
            suffix_tokens=8000,
            output_tokens=300,
            turns=2,
            think_time_s=30.0,
            rate=1.0,
            seed=29,
        )
        return tuple(shared_prefix_requests(spec))
    raise SystemExit(f"unknown trace {name!r} (conversation, synthetic)")


@functools.lru_cache(maxsize=4)
def shaped(trace: str, shape: str, span_s: float, limit: int) -> tuple[SimRequest, ...]:
    """The trace's requests arriving within ``span_s`` under the shape (module docstring)."""
    base = base_trace(trace, limit)
    curve = parse_curve(shape)
    area = sum(curve((i + 0.5) * GRID_S) * GRID_S for i in range(int(span_s / GRID_S)))
    k = max(r.arrival_s for r in base) / area
    return tuple(warp(list(base), lambda t: k * curve(t)))


def config(args: argparse.Namespace) -> ReplayConfig:
    return ReplayConfig(
        router=RouterConfig(policy="kv", block_size=64, seed=0),
        ttft_slo_ms=args.ttft_slo_ms,
        itl_slo_ms=args.itl_slo_ms,
        startup_s=args.startup_s,
    )


def run_fixed(args: argparse.Namespace, trace: str, shape: str, n: int) -> dict[str, Any]:
    reqs = shaped(trace, shape, args.span_s, args.limit)
    return replay(list(reqs), replace(config(args), num_workers=n)).to_dict()


def run_policy(args: argparse.Namespace, trace: str, shape: str, policy: str, start: int) -> dict[str, Any]:
    reqs = shaped(trace, shape, args.span_s, args.limit)
    pc = PlannerConfig(
        policy=policy,
        both=RoleBounds(args.min_workers, args.max_workers),
        ttft_ms=args.ttft_slo_ms,
        itl_ms=args.itl_slo_ms,
        profile=args.profile if policy == "sla" else None,
        attainment=args.aim or args.target,
        **({} if args.ramp_s is None else {"ramp_s": args.ramp_s}),
    )
    prof = load_profile(args.profile) if policy == "sla" else None
    r = replay(list(reqs), replace(config(args), num_workers=start, planner=pc, profile=prof))
    return r.to_dict()


def run_schedule(
    args: argparse.Namespace, trace: str, shape: str, _name: str, schedule: tuple[tuple[float, int], ...]
) -> dict[str, Any]:
    reqs = shaped(trace, shape, args.span_s, args.limit)
    pc = PlannerConfig(both=RoleBounds(args.min_workers, args.max_workers))
    cfg = replace(config(args), num_workers=schedule[0][1], planner=pc, fleet_schedule=schedule)
    return replay(list(reqs), cfg).to_dict()


def causal_schedule(
    args: argparse.Namespace, fixed: dict[int, ReplayReport], reqs: tuple[SimRequest, ...]
) -> tuple[tuple[float, int], ...]:
    """The offline bound's sizes within the misses of the cheapest fixed fleet reaching the
    target, as ``(from_s, size)`` pieces (empty: no fixed fleet reaches it)."""
    n95 = cheapest_reaching(fixed, args.target)
    if n95 is None:
        return ()
    _, sizes = offline_bound(fixed, max(r.arrival_s for r in reqs), args.bucket_s, misses(fixed[n95]))
    lead, plus = args.causal_lead_s, args.causal_plus
    sched = [(max(i * args.bucket_s - lead, 0.0) if i else 0.0, n + plus) for i, n in enumerate(sizes)]
    return tuple(p for i, p in enumerate(sched) if i == 0 or p[1] != sched[i - 1][1])


def report_of(d: dict[str, Any]) -> ReplayReport:
    return ReplayReport(**{**d, "planner_decisions": (), "missed_arrivals_s": tuple(d["missed_arrivals_s"])})


def _call(job: tuple[Any, ...]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    fn, *rest = job
    return tuple(rest[1:]), fn(*rest)


def frontier(args: argparse.Namespace, pool: Any, trace: str, shape: str) -> dict[int, ReplayReport]:
    """Fixed fleets from ``--min-workers`` up, ``--jobs`` sizes at a time, until one size past
    the first reaching ``--frontier-stop`` (cached in ``--cache``)."""
    path = os.path.join(args.cache, f"{trace}-{shape}.json") if args.cache else None
    if path and os.path.exists(path):
        with open(path) as f:
            return {int(n): report_of(d) for n, d in json.load(f).items()}
    out: dict[int, dict[str, Any]] = {}
    n, stop_at = args.min_workers, args.max_workers
    while n <= stop_at:
        sizes = list(range(n, min(n + args.jobs, stop_at + 1)))
        for (_, _, size), d in pool.map(_call, [(run_fixed, args, trace, shape, s) for s in sizes]):
            out[size] = d
            if d["sla_attainment"] >= args.frontier_stop:
                stop_at = min(stop_at, size + 1)
        n = sizes[-1] + 1
    if path:
        os.makedirs(args.cache, exist_ok=True)
        with open(path, "w") as f:
            json.dump(out, f)
    return {k: report_of(v) for k, v in out.items()}


def warm_start(args: argparse.Namespace, fixed: dict[int, ReplayReport], reqs: tuple[SimRequest, ...]) -> int:
    """The smallest fixed size that met the target over the first ``--warm-s``."""
    first = sum(1 for r in reqs if r.arrival_s < args.warm_s)
    for n in sorted(fixed):
        missed = sum(1 for t in fixed[n].missed_arrivals_s if t < args.warm_s)
        if missed <= (1 - args.target) * first:
            return max(n, args.min_workers)
    return max(fixed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces", default="conversation,synthetic")
    ap.add_argument("--shapes", default=",".join(FAMILY), help="FAMILY names or curves")
    ap.add_argument("--policies", default="reactive,sla")
    ap.add_argument("--profile", default=None, help="capability profile (the sla policy needs it)")
    ap.add_argument("--span-s", type=float, default=1800.0)
    ap.add_argument("--limit", type=int, default=0, help="requests per trace (0: all / the default)")
    ap.add_argument("--min-workers", type=int, default=1)
    ap.add_argument("--max-workers", type=int, default=16)
    ap.add_argument("--frontier-stop", type=float, default=0.985)
    ap.add_argument("--warm-s", type=float, default=300.0)
    ap.add_argument("--target", type=float, default=0.95)
    ap.add_argument("--saving", type=float, default=0.10)
    ap.add_argument(
        "--aim", type=float, default=0.0, help="the planners' attainment key (0: --target, the SLO asked for)"
    )
    ap.add_argument("--ttft-slo-ms", type=float, default=2000.0)
    ap.add_argument("--itl-slo-ms", type=float, default=50.0)
    ap.add_argument("--startup-s", type=float, default=30.0)
    ap.add_argument("--bucket-s", type=float, default=25.0, help="offline bound: one size per bucket")
    ap.add_argument("--ramp-s", type=float, default=None, help="the planners' ramp_s (default: the key's)")
    ap.add_argument("--causal-lead-s", type=float, default=0.0, help="causal bound: each size this early")
    ap.add_argument("--causal-plus", type=int, default=0, help="causal bound: this many workers more")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--cache", default=None, help="keep fixed replays here (one JSON per trace and shape)")
    ap.add_argument("--json", default=None, help="also write every figure here")
    ap.add_argument("--decisions", action="store_true", help="print each planner's decisions")
    args = ap.parse_args()
    policies = [p for p in args.policies.split(",") if p]
    if "sla" in policies and not args.profile:
        raise SystemExit("--policies sla needs --profile (interlock profile --runner mock -o FILE)")
    t0 = time.perf_counter()
    results: dict[str, Any] = {}
    ok = {"sla": 0, "reactive": 0}
    total = 0
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(args.jobs) as pool:
        for trace in args.traces.split(","):
            print(f"\n## {trace}", flush=True)
            print(
                f"{'shape':<15} {'reqs':>6} {'fixed>=' + format(args.target, '.0%'):>20} "
                f"{'bound':>7} {'causal':>17} {'reactive':>17} {'fixed@same':>10} {'sla':>17} {'saved':>6}  targets",
                flush=True,
            )
            for shape in args.shapes.split(","):
                reqs = shaped(trace, shape, args.span_s, args.limit)
                fixed = frontier(args, pool, trace, shape)
                start = warm_start(args, fixed, reqs)
                jobs: list[tuple[Any, ...]] = [(run_policy, args, trace, shape, p, start) for p in policies]
                sched = causal_schedule(args, fixed, reqs)
                if sched:
                    jobs.append((run_schedule, args, trace, shape, "causal", sched))
                done = pool.map(_call, jobs)
                got = {key[2]: report_of(d) for key, d in done}
                decisions = (
                    {key[2]: d["planner_decisions"] for key, d in done if key[2] != "causal"}
                    if args.decisions
                    else {}
                )
                results[f"{trace}/{shape}"] = row(args, trace, shape, reqs, fixed, got, start, ok)
                total += 1
                for p, ds in decisions.items():
                    print(f"   {p}:")
                    for d in ds:
                        print(f"      t={d['at']:.0f} {d['kind']} {d['reason']}")
    print(
        f"\nSLA policy met its targets on {ok['sla']} of {total} shapes; reactive on "
        f"{ok['reactive']} of {total}; {time.perf_counter() - t0:.0f} s"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


def row(
    args: argparse.Namespace,
    trace: str,
    shape: str,
    reqs: tuple[SimRequest, ...],
    fixed: dict[int, ReplayReport],
    got: dict[str, ReplayReport],
    start: int,
    ok: dict[str, int],
) -> dict[str, Any]:
    n95 = cheapest_reaching(fixed, args.target)
    f95 = fixed[n95] if n95 is not None else None
    span = max(r.arrival_s for r in reqs)
    budget = math.floor((1 - args.target) * len(reqs))
    bound_ws, _ = offline_bound(fixed, span, args.bucket_s, budget)
    out: dict[str, Any] = {
        "requests": len(reqs),
        "start": start,
        "fixed": {n: (r.sla_attainment, r.worker_seconds) for n, r in fixed.items()},
        "cheapest_fixed": n95,
        "bound_ws": bound_ws,
    }
    fx = f"{n95}: {100 * f95.sla_attainment:.1f}% {f95.worker_seconds:>7,.0f}" if f95 else "none"
    cb = got.get("causal")
    causal = f"{100 * cb.sla_attainment:>6.1f}% {cb.worker_seconds:>9,.0f}" if cb else f"{'-':>17}"
    if cb is not None:
        out["causal"] = {"attainment": cb.sla_attainment, "worker_seconds": cb.worker_seconds}
    cells, marks = [], []
    for p in ("reactive", "sla"):
        r = got.get(p)
        if r is None:
            cells.append(f"{'-':>17}")
            continue
        cells.append(f"{100 * r.sla_attainment:>6.1f}% {r.worker_seconds:>9,.0f}")
        same = attainment_at(fixed, r.worker_seconds)
        out[p] = {
            "attainment": r.sla_attainment,
            "worker_seconds": r.worker_seconds,
            "fixed_same_ws": same,
            "decisions": len(r.planner_decisions),
            "ttft_p99_ms": r.ttft_p99_ms,
            "misses": misses(r),
        }
        if p == "reactive":
            good = r.sla_attainment >= same - 1e-9
            cells.append(f"{100 * same:>9.1f}%")
            marks.append(f"reactive {'ok' if good else 'MISS'}")
        else:
            good = (
                f95 is not None
                and r.sla_attainment >= args.target
                and r.sla_attainment >= f95.sla_attainment - 1e-9
                and r.worker_seconds <= (1 - args.saving) * f95.worker_seconds
            )
            marks.append(f"sla {'ok' if good else 'MISS'}")
        ok[p] += good
        out[p]["target_met"] = good
    if "reactive" not in got:
        cells.insert(1, f"{'-':>10}")
    saved = (
        f"{100 * (1 - got['sla'].worker_seconds / f95.worker_seconds):>5.0f}%"
        if "sla" in got and f95
        else "     -"
    )
    print(
        f"{shape:<15} {len(reqs):>6} {fx:>20} {bound_ws:>7,.0f} {causal} {cells[0]} {cells[1]} {cells[2]} {saved}  "
        + ", ".join(marks),
        flush=True,
    )
    return out


if __name__ == "__main__":
    main()
