"""``interlock replay TRACE``: replay a Mooncake-format trace in virtual time against simulated
workers behind the router, and print the report.

Offline only for now: replay against running worker processes (online) is not implemented.
With ``--planner reactive|sla`` the fleet grows and shrinks during the replay (``--workers`` is
where it starts); ``--rate-curve`` multiplies the trace's arrival rate by a curve
(``interlock.sim.rate``). The report gives SLA attainment, worker-seconds and every planner
decision.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from interlock.cli import flags
from interlock.errors import ConfigError
from interlock.mooncake import TRACE_BLOCK_SIZE, load_mooncake
from interlock.planner import load_profile
from interlock.planner.flags import add_planner_flags, planner_config_from_args
from interlock.router import POLICIES, RouterConfig
from interlock.router.cost import CostParams
from interlock.sim import ReplayConfig, SimRequest, TraceHasher, mooncake_requests, replay
from interlock.sim.rate import FAMILY, parse_curve, warp


def build_parser() -> argparse.ArgumentParser:
    p = flags.parser("interlock replay", __doc__)
    p.add_argument("trace", help="Mooncake-format JSONL trace")
    p.add_argument("--workers", type=int, default=ReplayConfig.num_workers)
    p.add_argument("--policy", choices=POLICIES, default=RouterConfig.policy)
    p.add_argument(
        "--speedup", type=float, default=1.0, help="arrival speed-up: divide inter-arrival times by this"
    )
    _add_worker_args(p)
    _add_router_args(p)
    p.add_argument("--limit", type=int, default=None, help="replay only the first N requests")
    p.add_argument(
        "--backend",
        choices=("fast", "engine"),
        default=ReplayConfig.backend,
        help="fast: the event-driven worker model; engine: the real EngineCore with "
        "the mock runner (exact, one Python step per token: small traces only)",
    )
    _add_host_tier_args(p)
    p.add_argument(
        "--rate-curve",
        default=None,
        metavar="SPEC",
        help="multiply the arrival rate (after --speedup): steps:600x1,600x3,600x1, "
        "diurnal:period=3600,min=0.5,max=2, ramp:from=1,to=4,over=1200[,after=300], "
        "spike:base=1,peak=3,at=600,width=60, flash:base=1,peak=6,at=600,rise=10,decay=300, "
        "or a load shape by name: " + ", ".join(FAMILY),
    )
    _add_slo_args(p)
    add_planner_flags(p)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    return flags.apply_environment(p)


def _add_worker_args(p: argparse.ArgumentParser) -> None:
    """The simulated workers: KV cache, batching, speed, and whether they publish KV events."""
    p.add_argument("--blocks-per-worker", type=int, default=ReplayConfig.num_blocks)
    p.add_argument("--block-size", type=int, default=ReplayConfig.block_size)
    p.add_argument("--trace-block-size", type=int, default=TRACE_BLOCK_SIZE)
    p.add_argument("--max-num-batched-tokens", type=int, default=ReplayConfig.max_num_batched_tokens)
    p.add_argument("--max-num-seqs", type=int, default=ReplayConfig.max_num_seqs)
    p.add_argument(
        "--engine-speedup", type=float, default=ReplayConfig.engine_speedup, help="divide step times by this"
    )
    p.add_argument(
        "--no-kv-events",
        action="store_true",
        help="workers publish no KV events (router predicts their caches)",
    )
    p.add_argument(
        "--report-interval",
        type=float,
        default=ReplayConfig.report_interval_s,
        metavar="SECONDS",
        help="each worker's load reports at most this often, as a deployed worker paces them "
        "(0: one after every engine step)",
    )


def _add_router_args(p: argparse.ArgumentParser) -> None:
    """The router's queue and the cost its kv policy minimises (``RouterConfig``, ``CostParams``)."""
    p.add_argument(
        "--queue-capacity",
        type=int,
        default=RouterConfig.queue_capacity,
        help="router admission queue; past it requests are rejected (503), and counted",
    )
    p.add_argument(
        "--queue-depth-threshold",
        type=int,
        default=ReplayConfig.queue_depth_threshold,
        help="a worker with more requests waiting is busy for routing (0: never)",
    )
    p.add_argument("--miss-weight", type=float, default=CostParams.miss_weight)
    p.add_argument("--temperature", type=float, default=CostParams.temperature)


def _add_host_tier_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--host-kv-blocks",
        type=int,
        default=ReplayConfig.host_kv_blocks,
        help="host-memory KV tier per host, shared by its workers (0: none; fast backend)",
    )
    p.add_argument(
        "--workers-per-host",
        type=int,
        default=None,
        help=f"workers sharing one host tier (default: {ReplayConfig.workers_per_host}; needs --host-kv-blocks)",
    )
    p.add_argument(
        "--host-load-ms",
        type=float,
        default=None,
        help=f"modelled ms to load one block from host (default: {ReplayConfig.host_load_s_per_block * 1000:g};"
        " needs --host-kv-blocks)",
    )


def _add_slo_args(p: argparse.ArgumentParser) -> None:
    """The latency targets, and how long a started worker takes to join (for the planner)."""
    p.add_argument(
        "--ttft-slo-ms",
        type=float,
        default=ReplayConfig.ttft_slo_ms,
        help="TTFT target (SLA attainment; the sla planner's target too)",
    )
    p.add_argument(
        "--itl-slo-ms",
        type=float,
        default=ReplayConfig.itl_slo_ms,
        help="inter-token latency target (as --ttft-slo-ms)",
    )
    p.add_argument(
        "--startup-s",
        type=float,
        default=ReplayConfig.startup_s,
        help="a worker the planner starts joins the router this much later",
    )


def main(argv: list[str]) -> int:
    return flags.run_checked("interlock replay", _run, build_parser().parse_args(argv))


def _run(args: argparse.Namespace) -> int:
    requests = _requests(args)
    cfg = _replay_config(args)
    report = replay(requests, cfg)
    if args.json:
        json.dump(report.to_dict(), sys.stdout, indent=2)
        print()
        return 0
    planner = f" to start, planner {cfg.planner.policy}" if cfg.planner else ""
    print(
        f"trace {args.trace}: {len(requests)} requests, arrivals x{args.speedup}"
        f"{' then ' + args.rate_curve if args.rate_curve else ''}, "
        f"{args.workers} workers{planner} x {args.blocks_per_worker} blocks of {args.block_size}"
    )
    print(report.render())
    return 0


def _requests(args: argparse.Namespace) -> list[SimRequest]:
    """The trace's requests as the simulated workers take them, arrivals warped by the curve."""
    records = load_mooncake(args.trace, limit=args.limit)
    requests = mooncake_requests(
        records,
        block_size=args.block_size,
        speedup=args.speedup,
        hasher=TraceHasher(args.block_size, args.trace_block_size),
        with_tokens=args.backend == "engine",
    )
    return warp(requests, parse_curve(args.rate_curve)) if args.rate_curve else requests


def _replay_config(args: argparse.Namespace) -> ReplayConfig:
    planner = planner_config_from_args(args, ttft_ms=args.ttft_slo_ms, itl_ms=args.itl_slo_ms)
    if planner is None and args.startup_s != ReplayConfig.startup_s:
        raise ConfigError("--startup-s needs --planner (only the planner starts workers)")
    profile = load_profile(planner.profile) if planner and planner.profile else None
    if not args.host_kv_blocks and (args.workers_per_host is not None or args.host_load_ms is not None):
        raise ConfigError(
            "--workers-per-host and --host-load-ms shape a host tier: give --host-kv-blocks too"
        )
    return ReplayConfig(
        num_workers=args.workers,
        num_blocks=args.blocks_per_worker,
        block_size=args.block_size,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        engine_speedup=args.engine_speedup,
        publish_events=not args.no_kv_events,
        report_interval_s=args.report_interval,
        backend=args.backend,
        queue_depth_threshold=args.queue_depth_threshold,
        host_kv_blocks=args.host_kv_blocks,
        workers_per_host=ReplayConfig.workers_per_host
        if args.workers_per_host is None
        else args.workers_per_host,
        host_load_s_per_block=(
            ReplayConfig.host_load_s_per_block if args.host_load_ms is None else args.host_load_ms / 1000.0
        ),
        router=_router_config(args),
        ttft_slo_ms=args.ttft_slo_ms,
        itl_slo_ms=args.itl_slo_ms,
        planner=planner,
        profile=profile,
        startup_s=args.startup_s,
    )


def _router_config(args: argparse.Namespace) -> RouterConfig:
    cost = replace(CostParams(), miss_weight=args.miss_weight, temperature=args.temperature)
    return RouterConfig(
        policy=args.policy,
        block_size=args.block_size,
        cost=cost,
        queue_capacity=args.queue_capacity,
        seed=0,
    )
