"""The fast simulator against the real engine: the same replay with ``SimWorker`` and with
``EngineCore`` + ``MockRunner`` (``ReplayConfig(backend="engine")``), on small traces.

Workloads: the first requests of the Mooncake conversation trace, and a slice of the
long-context agent workload (``sim.synthetic.AgentSpec``), each on workers small enough that
KV runs out (preemption happens), under round-robin (identical routing: the workers alone
differ) and kv (the workers' reports steer the router, so differences feed back). Targets: hit
ratio within 2% and TTFT p50/p99 within 10%.

    .venv/bin/python benchmarks/sim_agreement.py [--requests 300] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from interlock.mooncake import MooncakeRecord, load_mooncake
from interlock.router import RouterConfig
from interlock.sim import ReplayConfig, ReplayReport, TraceHasher, mooncake_requests, replay
from interlock.sim.synthetic import AgentSpec, agent_records

TRACE = "/work/shared/traces/mooncake_conversation_trace.jsonl"


def workloads(args: argparse.Namespace) -> dict[str, tuple[list[MooncakeRecord], float, int]]:
    """name -> (records, arrival speed-up, blocks per worker)."""
    out = {}
    if Path(args.trace).exists():
        out["conversation"] = (
            load_mooncake(args.trace, limit=args.requests),
            args.conv_speedup,
            args.conv_blocks,
        )
    agent = agent_records(AgentSpec(num_sessions=args.requests // 4, seed=1))[: args.requests]
    out["agent"] = (agent, args.agent_speedup, args.agent_blocks)
    return out


def compare(
    records: list[MooncakeRecord], speedup: float, blocks: int, policy: str, workers: int
) -> tuple[ReplayReport, ReplayReport]:
    reqs = mooncake_requests(
        records, block_size=64, speedup=speedup, hasher=TraceHasher(64), with_tokens=True
    )
    reps = []
    for backend in ("fast", "engine"):
        cfg = ReplayConfig(
            num_workers=workers,
            num_blocks=blocks,
            backend=backend,
            router=RouterConfig(policy=policy, seed=0),
        )
        reps.append(replay(reqs, cfg))
    return reps[0], reps[1]


def diff(a: float, b: float) -> str:
    return f"{100 * (a - b) / b:+.1f}%" if b else "n/a"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=TRACE)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--conv-speedup", type=float, default=4.0)
    ap.add_argument("--conv-blocks", type=int, default=3000)
    ap.add_argument("--agent-speedup", type=float, default=2.0)
    ap.add_argument("--agent-blocks", type=int, default=1500)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = []
    print(
        "| workload | policy | hit ratio fast / engine (diff) | TTFT p50 ms fast / engine (diff) "
        "| TTFT p99 ms fast / engine (diff) | wall s fast / engine |"
    )
    print("|---|---|---|---|---|---|")
    for name, (records, speedup, blocks) in workloads(args).items():
        for policy in ("round-robin", "kv"):
            fast, eng = compare(records, speedup, blocks, policy, args.workers)
            rows.append(
                {
                    "workload": name,
                    "policy": policy,
                    "speedup": speedup,
                    "blocks": blocks,
                    "fast": fast.to_dict(),
                    "engine": eng.to_dict(),
                }
            )
            print(
                f"| {name} x{speedup}, {len(records)} req, {args.workers} x {blocks} blocks | "
                f"{policy} | {fast.hit_ratio:.4f} / {eng.hit_ratio:.4f} "
                f"({diff(fast.hit_ratio, eng.hit_ratio)}) | "
                f"{fast.ttft_p50_ms:,.0f} / {eng.ttft_p50_ms:,.0f} "
                f"({diff(fast.ttft_p50_ms, eng.ttft_p50_ms)}) | "
                f"{fast.ttft_p99_ms:,.0f} / {eng.ttft_p99_ms:,.0f} "
                f"({diff(fast.ttft_p99_ms, eng.ttft_p99_ms)}) | "
                f"{fast.wall_s:.1f} / {eng.wall_s:.1f} |",
                flush=True,
            )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
