"""Roles follow the mix: 2 prefill + 2 decode workers on a trace that turns from prefill-heavy
to decode-heavy, with and without the planner switching roles (virtual time, mock runners).

    .venv/bin/python benchmarks/role_sim.py                  # the BENCHMARKS.md table
    .venv/bin/python benchmarks/role_sim.py --requests 600 --rate 12

The simulator is ``benchmarks/disagg_sim.py``'s (real ``EngineCore`` + ``MockRunner`` per
worker, one event heap, KV moved over a modelled link), with the planner's decision core
(``interlock.planner``) observing every ``--interval`` seconds of virtual time. A role switch
takes the worker out of its pool at once (no new requests) and puts it in the other pool when
its last request has left, as the live ``set_role`` control call does.

Trace: the first half of the requests are prefill-heavy (long prompts, short answers), the
second half decode-heavy (short prompts, long answers), Poisson arrivals at ``--rate``.
Goodput: requests per second meeting TTFT <= ``--ttft-slo`` and mean inter-token time <=
``--itl-slo``, over the time from the first arrival to the last finish.
"""

from __future__ import annotations

import argparse
import random
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from disagg_sim import Req, Sim, SimEngine, measure  # noqa: E402

from interlock.planner import (  # noqa: E402
    Observation,
    PlannerConfig,
    RoleBounds,
    SwitchRole,
    Traffic,
    WorkerView,
    build_planner,
    load_profile,
)


class RoleSim(Sim):
    def __init__(self, args: argparse.Namespace, planner_cfg: PlannerConfig | None) -> None:
        super().__init__(args, prefill=2, decode=2, aggregated=0)
        self.planner = build_planner(planner_cfg) if planner_cfg else None
        self.switching: dict[str, tuple[SimEngine, str]] = {}
        self.pending = 0
        self.arrived: list[Req] = []
        self.last_tick = 0.0
        self.switches: list[str] = []

    def role_of(self, e: SimEngine) -> str:
        return "prefill" if e in self.prefill else "decode"

    def view(self, e: SimEngine, role: str, ready: bool = True) -> WorkerView:
        ld = e.core.load
        return WorkerView(
            e.wid,
            role,
            num_running=ld.num_running,
            num_waiting=ld.num_waiting,
            queued_prefill_tokens=e.core.scheduler.queued_prefill_tokens(),
            prefill_tokens_per_s=ld.prefill_tokens_per_s,
            decode_step_s=ld.decode_step_s,
            kv_usage=e.core.pool.num_used_blocks / e.core.pool.num_blocks,
            ready=ready,
        )

    def tick(self, now: float) -> None:
        assert self.planner is not None
        for wid, (e, role) in list(self.switching.items()):
            if not e.inflight and not e.core.has_unfinished():
                (self.prefill if role == "prefill" else self.decode).append(e)
                del self.switching[wid]
        views = [self.view(e, "prefill") for e in self.prefill]
        views += [self.view(e, "decode") for e in self.decode]
        views += [self.view(e, role, ready=False) for e, role in self.switching.values()]
        traffic = Traffic(
            now - self.last_tick,
            len(self.arrived),
            sum(len(r.prompt) for r in self.arrived),
            0,
            sum(r.output_tokens for r in self.arrived),
        )
        self.arrived, self.last_tick = [], now
        for a in self.planner.decide(Observation(now, tuple(views), traffic=traffic)):
            assert isinstance(a, SwitchRole), a
            e = next(x for x in self.prefill + self.decode if x.wid == a.worker_id)
            (self.prefill if e in self.prefill else self.decode).remove(e)
            self.switching[e.wid] = (e, a.role)
            self.switches.append(self.planner.history[-1].line())
        if self.pending or any(e.core.has_unfinished() or e.inflight for e in self.all()):
            self.push(now + self.args.interval, "tick", None)

    def all(self) -> list[SimEngine]:
        return self.prefill + self.decode + [e for e, _ in self.switching.values()]

    def arrive(self, r: Req, now: float) -> None:
        self.pending -= 1
        self.arrived.append(r)
        super().arrive(r, now)

    def run(self, trace: list[Req]) -> list[Req]:
        self.pending = len(trace)
        if self.planner is not None:
            self.push(0.0, "tick", None)
        return super().run(trace)


def make_trace(args: argparse.Namespace) -> list[Req]:
    rng = random.Random(args.seed)
    t, out = 0.0, []
    half = args.requests // 2
    for i in range(args.requests):
        t += rng.expovariate(args.rate)
        if i < half:
            n, osl = rng.randint(4000, 8000), rng.randint(20, 60)
        else:
            n, osl = rng.randint(200, 600), rng.randint(300, 600)
        prompt = tuple(rng.randrange(3, 40000) for _ in range(n))
        out.append(Req(f"r{i}", t, prompt, osl))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--rate", type=float, default=14.0)
    ap.add_argument("--ttft-slo", type=float, default=2.0)
    ap.add_argument("--itl-slo", type=float, default=0.02)
    ap.add_argument("--chunk", type=int, default=2048)
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--num-blocks", type=int, default=2000)
    ap.add_argument("--kv-bytes-per-token", type=int, default=128 * 1024, help="Llama-3-8B bf16")
    ap.add_argument("--bandwidth", type=float, default=25e9)
    ap.add_argument("--rtt", type=float, default=1e-4)
    ap.add_argument("--interval", type=float, default=2.0, help="planner observation period (s)")
    ap.add_argument("--window", type=float, default=10.0, help="planner window (s)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--profile",
        default=None,
        help="capability profile of these workers (adds an sla planner run): "
        "interlock profile --runner mock --num-blocks 2000 --max-num-batched-tokens 2048 --contexts 256,1024,4096",
    )
    args = ap.parse_args()
    args.conditional = False
    cfg = PlannerConfig(
        both=RoleBounds(0, 0),
        prefill=RoleBounds(1, 3),
        decode=RoleBounds(1, 3),
        min_workers=4,
        max_workers=4,
        interval_s=args.interval,
        window_s=args.window,
        max_changes=100,
        ramp_s=0.0,
        ttft_ms=args.ttft_slo * 1000,
        itl_ms=args.itl_slo * 1000,
    )
    print(
        f"2P+2D, {args.requests} requests at {args.rate} req/s: first half ISL 4000-8000 / OSL "
        f"20-60, second half ISL 200-600 / OSL 300-600; SLO TTFT <= {args.ttft_slo}s, "
        f"TPOT <= {args.itl_slo * 1e3:.0f}ms; {args.num_blocks} KV blocks of {args.block_size} per worker"
    )
    print(f"{'setup':<20} {'goodput':>8} {'met':>9} {'TTFT p50':>9} {'p99':>8} {'TPOT p50':>9} {'p99':>7}")
    runs: list[tuple[str, PlannerConfig | None]] = [("static 2P+2D", None), ("planner (reactive)", cfg)]
    if args.profile:
        load_profile(args.profile)  # a bad file fails here, before any run
        runs.append(
            (
                "planner (sla)",
                replace(cfg, policy="sla", profile=args.profile),
            )
        )
    for name, planner in runs:
        sim = RoleSim(args, planner)
        trace = sim.run(make_trace(args))
        r = measure(name, trace, args, args.rate)
        print(
            f"{r.name:<20} {r.goodput:>8.2f} {r.met:>4}/{r.done:<4} {r.ttft_p50 * 1e3:>7.0f}ms "
            f"{r.ttft_p99 * 1e3:>6.0f}ms {r.tpot_p50 * 1e3:>7.1f}ms {r.tpot_p99 * 1e3:>5.1f}ms",
            flush=True,
        )
        for line in sim.switches:
            print(f"    {line}")


if __name__ == "__main__":
    main()
