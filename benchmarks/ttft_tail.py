"""Where the slowest first tokens of a replay come from: each request's TTFT taken apart.

For every request, in virtual time (the same replay as ``replay_compare.py``):

* ``router``: arrival to dispatch (the router's queue);
* ``waiting``: dispatch to admission by the worker's scheduler (its waiting queue);
* ``own``: its own prefill chunks, each timed as if the step had computed only that chunk;
* ``shared``: the rest of the steps that computed its chunks (other requests' chunks and the
  decodes batched with them);
* ``skipped``: steps after admission that gave it no tokens (the budget went to requests
  admitted before it);
* ``preempt``: times it was preempted before its first token.

``--compare`` replays a second cost (the pre-sat4 one by default) and lists, for the slowest
requests of the first, what the second gave them.

    PYTHONPATH=. .venv/bin/python benchmarks/ttft_tail.py --speedup 7.5 [--cost stall_weight=0,...]
"""

from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from interlock.engine.timing import prefill_ms
from interlock.mooncake import load_mooncake
from interlock.router import RouterConfig
from interlock.router.cost import CostParams
from interlock.sim import ReplayConfig, TraceHasher, mooncake_requests
from interlock.sim.trace import SimRequest
from interlock.sim.worker import SimSeq, SimWorker

sys.path.insert(0, str(Path(__file__).resolve().parent))
from replay_compare import parse_cost  # noqa: E402

sim_replay = importlib.import_module("interlock.sim.replay")
TRACE = "/work/shared/traces/mooncake_conversation_trace.jsonl"


@dataclass
class Parts:
    worker: str = ""
    dispatch: float = -1.0
    admit: float = -1.0
    own: float = 0.0
    shared: float = 0.0
    in_steps: float = 0.0
    chunks: int = 0
    preempt: int = 0
    best_overlap: int = 0
    """Most blocks of the prompt any worker held when it was routed."""
    overlap: int = 0
    """Blocks the chosen worker held."""
    queued_at_dispatch: int = 0
    """Prefill tokens queued on the chosen worker when it was routed (its last report)."""
    decoding_at_dispatch: float = 0.0
    fleet_queued: float = 0.0
    notes: list[str] = field(default_factory=list)


PARTS: dict[str, Parts] = {}


class TracedWorker(SimWorker):
    """A ``SimWorker`` that writes down each request's time until its first token."""

    def start_step(self, now: float) -> float | None:
        fresh = self.step is None
        end = super().start_step(now)
        st = self.step
        if fresh and st is not None and st.k == 1:
            step_s = st.end - st.start
            for s, n in st.sched:
                if s.first_token_s >= 0 or not s.running:
                    continue
                p = PARTS[s.req.request_id]
                if p.admit < 0:
                    p.admit = now
                if n == 1 and s.outputs:
                    continue
                alone = prefill_ms(n) / self.timing.speedup / 1000.0
                p.own += alone
                p.shared += step_s - alone
                p.in_steps += step_s
                p.chunks += 1
        return end

    def _preempt(self, s: SimSeq) -> None:
        if s.first_token_s < 0:
            PARTS[s.req.request_id].preempt += 1
        super()._preempt(s)


class TracedDriver(sim_replay._Driver):
    def arrive(self, req: SimRequest) -> None:
        r = self.router
        n = max(r._slot_ids) + 1
        p = PARTS.setdefault(req.request_id, Parts())
        if req.block_hashes:
            ov = r.indexer.overlaps(req.block_hashes, n)
            p.best_overlap = int(ov.max())
        p.fleet_queued = float(r.load.queued_prefill()[:n].mean())
        super().arrive(req)

    def _send(self, req: SimRequest, wid: str) -> None:
        p = PARTS[req.request_id]
        p.worker, p.dispatch = wid, self.now
        r = self.router
        n = max(r._slot_ids) + 1
        slot = r._workers[wid].slot
        p.queued_at_dispatch = int(r.load.queued_prefill()[slot])
        p.decoding_at_dispatch = float(r.load.decoding[slot])
        if req.block_hashes:
            p.overlap = int(r.indexer.overlaps(req.block_hashes, n)[slot])
        super()._send(req, wid)


def run(reqs: list[SimRequest], cost: CostParams, blocks: int) -> dict[str, tuple[SimSeq, Parts]]:
    """Replay with ``kv`` at ``cost``: each finished request with its parts."""
    PARTS.clear()
    sim_replay.SimWorker = TracedWorker  # the driver builds its fast workers from this name
    try:
        cfg = ReplayConfig(
            num_blocks=blocks, router=RouterConfig(policy="kv", block_size=64, seed=0, cost=cost)
        )
        drv = TracedDriver(cfg)
        drv.run(sorted(reqs, key=lambda q: q.arrival_s))
    finally:
        sim_replay.SimWorker = SimWorker
    return {s.req.request_id: (s, PARTS[s.req.request_id]) for s in drv.done}


def ttft(s: SimSeq) -> float:
    return s.first_token_s - s.req.arrival_s


def line(rid: str, s: SimSeq, p: Parts) -> str:
    bs = 64
    skipped = (s.first_token_s - p.admit) - p.in_steps
    return (
        f"{rid:>6} {ttft(s) * 1000:7.0f} | in {s.req.prompt_tokens:6d} hit {s.hit_tokens:6d} "
        f"(best {p.best_overlap * bs:6d}) | router {(p.dispatch - s.req.arrival_s) * 1000:5.0f} "
        f"wait {(p.admit - p.dispatch) * 1000:5.0f} own {p.own * 1000:5.0f} "
        f"shared {p.shared * 1000:5.0f} skipped {skipped * 1000:5.0f} pre {p.preempt} | "
        f"{p.worker} q {p.queued_at_dispatch:6d} fleet {p.fleet_queued:7.0f} dec {p.decoding_at_dispatch:3.0f}"
    )


def over(res: dict[str, tuple[SimSeq, Parts]], limit_s: float) -> None:
    """The requests whose TTFT is past ``limit_s`` (the p99 stays under it while they are at most
    1%), by what made them slow: their own prefill alone nearly as long (``own``), a wait of
    0.3 s or more in the worker's queue (``queued``), the rest."""
    late = [(s, p) for s, p in res.values() if ttft(s) > limit_s]
    own = [(s, p) for s, p in late if p.own >= 0.95 * limit_s]
    rest = [(s, p) for s, p in late if p.own < 0.95 * limit_s]
    queued = [(s, p) for s, p in rest if p.admit - p.dispatch >= 0.3]
    print(
        f"  past {limit_s * 1000:,.0f} ms: {len(late)} (1% is {len(res) // 100}); own prefill >= 95% of it: "
        f"{len(own)}; queued >= 0.3 s: {len(queued)} (of which uncached < 20k tokens: "
        f"{sum(1 for s, _ in queued if s.req.prompt_tokens - s.hit_tokens < 20_000)}); other: "
        f"{len(rest) - len(queued)}"
    )


def summary(name: str, res: dict[str, tuple[SimSeq, Parts]], top: float) -> list[str]:
    t = np.array([ttft(s) for s, _ in res.values()])
    hit = sum(s.hit_tokens for s, _ in res.values()) / sum(s.req.prompt_tokens for s, _ in res.values())
    print(
        f"{name}: hit ratio {hit:.3f}, TTFT p50 {np.percentile(t, 50) * 1000:.0f} p99 "
        f"{np.percentile(t, 99) * 1000:.0f} ms"
    )
    order = sorted(res, key=lambda r: -ttft(res[r][0]))
    k = max(1, int(len(order) * top))
    slow = order[:k]
    agg = np.zeros(6)
    for rid in slow:
        s, p = res[rid]
        agg += [
            p.dispatch - s.req.arrival_s,
            p.admit - p.dispatch,
            p.own,
            p.shared,
            max((s.first_token_s - p.admit) - p.in_steps, 0.0),
            ttft(s),
        ]
    agg /= k
    print(
        f"  slowest {k}: mean TTFT {agg[5] * 1000:.0f} ms = router {agg[0] * 1000:.0f} + waiting "
        f"{agg[1] * 1000:.0f} + own {agg[2] * 1000:.0f} + shared {agg[3] * 1000:.0f} + skipped "
        f"{agg[4] * 1000:.0f}; mean prompt {np.mean([res[r][0].req.prompt_tokens for r in slow]):.0f}, "
        f"hit {np.mean([res[r][0].hit_tokens for r in slow]):.0f}, best held "
        f"{np.mean([res[r][1].best_overlap * 64 for r in slow]):.0f}"
    )
    return slow


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=TRACE)
    ap.add_argument("--speedup", type=float, default=7.5)
    ap.add_argument("--blocks", type=int, default=61_000)
    ap.add_argument("--limit", type=int, default=0, help="first N requests only")
    ap.add_argument("--cost", default="", help="CostParams fields, e.g. stall_weight=0,decode_weight=0.2")
    ap.add_argument(
        "--compare",
        default="backlog_charge=0,stall_weight=0,decode_weight=0.225",
        help="a second cost to replay ('' for none)",
    )
    ap.add_argument("--top", type=float, default=0.01, help="share of slowest requests to show")
    ap.add_argument("--show", type=int, default=40)
    ap.add_argument(
        "--limit-ms",
        type=float,
        default=1717.0,
        help="count requests past this TTFT (default: least-loaded's p99 / 2)",
    )
    args = ap.parse_args()
    records = load_mooncake(args.trace)
    if args.limit:
        records = records[: args.limit]
    reqs = mooncake_requests(records, block_size=64, speedup=args.speedup, hasher=TraceHasher(64))
    a = run(reqs, parse_cost(args.cost), args.blocks)
    slow = summary(f"cost [{args.cost or 'defaults'}]", a, args.top)
    over(a, args.limit_ms / 1000)
    b = None
    if args.compare:
        b = run(reqs, parse_cost(args.compare), args.blocks)
        slow_b = summary(f"cost [{args.compare}]", b, args.top)
        over(b, args.limit_ms / 1000)
        print(f"  of the first's slowest {len(slow)}, {len(set(slow) & set(slow_b))} are among the second's")
    for rid in slow[: args.show]:
        s, p = a[rid]
        print(line(rid, s, p))
        if b is not None:
            sb, pb = b[rid]
            print("  vs  " + line(rid, sb, pb))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
