"""Check that a change to the router's code keeps its choices: every routing decision (request,
worker, reason, overlap) and the replay report, for the Mooncake conversation trace and the
long-context agent workload, written to JSON; run it on two code trees and compare.

    PYTHONPATH=/path/to/before .venv/bin/python benchmarks/router_same_choices.py --out before.json
    PYTHONPATH=/path/to/after  .venv/bin/python benchmarks/router_same_choices.py --out after.json
    .venv/bin/python benchmarks/router_same_choices.py --compare before.json after.json

Defaults: the whole conversation trace at arrival speed-ups x7.5 and x12 (8 workers x 61,000
blocks of 64 tokens) and 300 agent sessions at x1 and x3 (per-worker capacity a twelfth of the
distinct blocks), ``kv`` policy. The decisions are taken from ``Router._commit`` (wrapped here
to record them: the replay report has aggregates only). Timing fields (``decision_*``) and the
best candidate's explanation are reported apart: equal costs may list a different worker first.
"""

from __future__ import annotations

import argparse
import json
import sys

from interlock.mooncake import load_mooncake
from interlock.router import RouterConfig
from interlock.router.model_router import Router
from interlock.sim import ReplayConfig, TraceHasher, mooncake_requests, replay
from interlock.sim.synthetic import AgentSpec, agent_records

TRACE = "/work/shared/traces/mooncake_conversation_trace.jsonl"


def record_decisions() -> list[list]:
    log: list[list] = []
    commit = Router._commit

    def _commit(self, d, meta, hashes, now):  # type: ignore[no-untyped-def]
        out = commit(self, d, meta, hashes, now)
        best = d.candidates[0] if d.candidates else None
        log.append([d.request_id, d.worker_id, d.reason, d.overlap_blocks, best and best.worker_id])
        return out

    Router._commit = _commit  # type: ignore[method-assign]
    return log


def run(records, speedup: float, blocks: int, log: list) -> dict:
    log.clear()
    reqs = mooncake_requests(records, block_size=64, speedup=speedup, hasher=TraceHasher())
    cfg = ReplayConfig(
        num_workers=8, num_blocks=blocks, router=RouterConfig(policy="kv", block_size=64, seed=0)
    )
    report = replay(reqs, cfg).to_dict()
    report.pop("wall_s", None)
    return {"report": report, "decisions": list(log)}


def compare(a_path: str, b_path: str) -> int:
    a, b = json.load(open(a_path)), json.load(open(b_path))
    same = True
    for key in a:
        ra, rb = a[key]["report"], b[key]["report"]
        fields = [f for f in ra if ra[f] != rb.get(f) and not f.startswith("decision_")]
        da = [d[:4] for d in a[key]["decisions"]]
        db = [d[:4] for d in b[key]["decisions"]]
        ties = sum(x[4] != y[4] for x, y in zip(a[key]["decisions"], b[key]["decisions"], strict=False))
        ok = da == db and not fields
        same &= ok
        print(
            f"{key}: {len(da)} decisions {'identical' if da == db else 'DIFFER'}; report fields "
            f"differing (timing aside): {fields or 'none'}; best candidate listed differently: {ties}"
        )
    return 0 if same else 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    ap.add_argument("--speedups", default="7.5,12")
    ap.add_argument("--agent-speedups", default="1,3")
    ap.add_argument("--agent-sessions", type=int, default=300)
    ap.add_argument("--limit", type=int, default=0, help="first N trace requests (0: all)")
    args = ap.parse_args()
    if args.compare:
        sys.exit(compare(*args.compare))
    if not args.out:
        ap.error("--out or --compare is required")
    log = record_decisions()
    out = {}
    trace = load_mooncake(TRACE)
    trace = trace[: args.limit] if args.limit else trace
    for s in (float(x) for x in args.speedups.split(",")):
        out[f"conversation x{s}"] = run(trace, s, 61_000, log)
    agent = agent_records(AgentSpec(num_sessions=args.agent_sessions, seed=0))
    blocks = len({h for r in agent for h in r.hash_ids}) * 8 // 12
    for s in (float(x) for x in args.agent_speedups.split(",")):
        out[f"agent x{s}"] = run(agent, s, blocks, log)
    with open(args.out, "w") as f:
        json.dump(out, f)
    for key, v in out.items():
        print(key, len(v["decisions"]), "decisions, hit ratio", round(v["report"]["hit_ratio"], 4))


if __name__ == "__main__":
    main()
