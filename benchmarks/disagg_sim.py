"""Goodput of disaggregated vs aggregated serving, in virtual time with mock runners.

    .venv/bin/python benchmarks/disagg_sim.py                 # the BENCHMARKS.md table
    .venv/bin/python benchmarks/disagg_sim.py --rates 2 4 --requests 300

Each worker is a real ``EngineCore`` + ``MockRunner`` on its own ``VirtualClock`` (step times
from the Dynamo mocker fit, ``engine.timing``); one event heap drives arrivals, step ends and KV
transfers. A step is computed when it starts and its outputs land when it ends, as in
``interlock.sim.engine_worker``.

* aggregated: N workers, each request to the worker with the fewest requests in flight
  (ties: least queued prefill);
* disaggregated: P prefill + D decode workers. The prefill worker (least queued prefill) runs
  the prompt with ``do_remote_decode``; its first token is the TTFT; the KV (``kv_bytes_per_token``
  x prompt, Llama-3-8B-sized by default) then moves over a link of ``bandwidth`` + ``rtt``; the
  decode worker (fewest in flight) receives it with ``add_remote_request`` + ``finish_remote_kv``
  (the engine's real path: blocks allocated, parked without a batch slot, imported) and decodes.
  ``--conditional`` lets ``router.disagg.choose`` keep a request local on its decode worker.

Goodput: completed requests per second whose TTFT <= ``--ttft-slo`` and whose mean inter-token
time (TPOT) <= ``--itl-slo``, over the time from the first arrival to the last finish.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import math
import random
from dataclasses import dataclass, field

from interlock.engine.clock import VirtualClock
from interlock.engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from interlock.engine.core import EngineCore, StepResult
from interlock.engine.runners.mock import MockRunner
from interlock.engine.timing import TimingModel
from interlock.protocol import GenerateRequest, KVTransferParams, SamplingParams
from interlock.router.disagg import DisaggConfig, LinkEstimate, WorkerEstimate, choose


@dataclass
class Req:
    rid: str
    arrival: float
    prompt: tuple[int, ...]
    output_tokens: int
    first_s: float = -1.0
    finish_s: float = -1.0
    tokens: int = 0
    remote: bool = False


@dataclass
class SimEngine:
    wid: str
    core: EngineCore
    clock: VirtualClock
    busy: bool = False
    result: StepResult | None = None
    inflight: set[str] = field(default_factory=set)


def make_engine(wid: str, args: argparse.Namespace) -> SimEngine:
    clock = VirtualClock()
    config = EngineConfig(
        model=ModelConfig(runner="mock"),
        cache=CacheConfig(block_size=args.block_size, num_blocks=args.num_blocks),
        scheduler=SchedulerConfig(max_num_batched_tokens=args.chunk, max_num_seqs=256, max_model_len=1 << 20),
    )
    runner = MockRunner(
        num_blocks=args.num_blocks, block_size=args.block_size, timing=TimingModel(), clock=clock
    )
    return SimEngine(wid, EngineCore(config, runner, clock=clock, instance_id=wid), clock)


class Sim:
    def __init__(self, args: argparse.Namespace, *, prefill: int, decode: int, aggregated: int) -> None:
        self.args = args
        self.prefill = [make_engine(f"p{i}", args) for i in range(prefill)]
        self.decode = [make_engine(f"d{i}", args) for i in range(decode)]
        self.agg = [make_engine(f"a{i}", args) for i in range(aggregated)]
        self.heap: list[tuple[float, int, str, object]] = []
        self.seq = itertools.count()
        self.reqs: dict[str, Req] = {}
        self.dest: dict[str, SimEngine] = {}
        self.choices: dict[str, int] = {}
        self.link = LinkEstimate(args.bandwidth, args.rtt)

    def push(self, t: float, kind: str, obj: object) -> None:
        heapq.heappush(self.heap, (t, next(self.seq), kind, obj))

    # ---- placement ----
    @staticmethod
    def _least(engines: list[SimEngine]) -> SimEngine:
        return min(engines, key=lambda e: (len(e.inflight), e.core.scheduler.queued_prefill_tokens()))

    def arrive(self, r: Req, now: float) -> None:
        self.reqs[r.rid] = r
        sampling = SamplingParams(max_tokens=r.output_tokens, ignore_eos=True, temperature=0.0)
        if self.agg:
            self.submit(
                self._least(self.agg),
                GenerateRequest(request_id=r.rid, token_ids=r.prompt, sampling=sampling),
                now,
            )
            return
        d = self._least(self.decode)
        p = min(self.prefill, key=lambda e: e.core.scheduler.queued_prefill_tokens())
        if self.args.conditional and not self._go_remote(r, p, d):
            self.submit(d, GenerateRequest(request_id=r.rid, token_ids=r.prompt, sampling=sampling), now)
            return
        r.remote = True
        self.dest[r.rid] = d
        d.inflight.add(r.rid)  # reserved: counts for the decode worker's placement from now
        self.submit(
            p,
            GenerateRequest(
                request_id=r.rid,
                token_ids=r.prompt,
                sampling=sampling,
                kv_transfer=KVTransferParams(do_remote_decode=True),
            ),
            now,
        )

    def _go_remote(self, r: Req, p: SimEngine, d: SimEngine) -> bool:
        def est(e: SimEngine) -> WorkerEstimate:
            ld = e.core.load
            return WorkerEstimate(
                e.wid,
                queued_prefill_tokens=e.core.scheduler.queued_prefill_tokens(),
                prefill_tokens_per_s=ld.prefill_tokens_per_s,
                free_blocks=e.core.pool.num_free_blocks,
                num_running=ld.num_running,
                decode_step_s=ld.decode_step_s,
            )

        blocks = math.ceil(len(r.prompt) / self.args.block_size)
        c = choose(
            prompt_tokens=len(r.prompt),
            kv_bytes=len(r.prompt) * self.args.kv_bytes_per_token,
            blocks_needed=blocks,
            decode=est(d),
            prefill=est(p),
            link=self.link,
            config=DisaggConfig(default_prefill_tokens_per_s=50_000.0, chunk_tokens=self.args.chunk),
        )
        self.choices[c.reason] = self.choices.get(c.reason, 0) + 1
        return c.remote

    def submit(self, e: SimEngine, req: GenerateRequest, now: float) -> None:
        e.inflight.add(req.request_id)
        e.clock.advance_to(max(now, e.clock.now()))
        e.core.add_request(req)
        self.kick(e, now)

    def kick(self, e: SimEngine, now: float) -> None:
        if e.busy or not e.core.has_work():
            return
        e.clock.advance_to(max(now, e.clock.now()))
        e.result = e.core.step()
        e.busy = True
        self.push(now + e.result.step_time_s, "step", e)

    # ---- events ----
    def step_end(self, e: SimEngine, now: float) -> None:
        assert e.result is not None
        result, e.result, e.busy = e.result, None, False
        e.clock.advance_to(now)
        for out in result.outputs:
            r = self.reqs[out.request_id]
            if out.kv_transfer is not None:  # prefill done: first token, then the KV moves
                e.inflight.discard(r.rid)
                r.first_s, r.tokens = now, len(out.token_ids)
                _, data = e.core.export_request_kv(r.rid)
                e.core.release_request_kv(r.rid)
                t = self.link.transfer_time_s(len(r.prompt) * self.args.kv_bytes_per_token)
                self.push(now + t, "kv", (r, out.kv_transfer, data))
                continue
            if out.token_ids and r.first_s < 0:
                r.first_s = now
            r.tokens += len(out.token_ids)
            if out.finished:
                r.finish_s = now
                e.inflight.discard(r.rid)
        self.kick(e, now)

    def kv_arrived(self, r: Req, kt: KVTransferParams, data: bytes, now: float) -> None:
        d = self.dest[r.rid]
        kt = KVTransferParams(
            do_remote_prefill=True,
            first_token_id=kt.first_token_id,
            num_computed_tokens=kt.num_computed_tokens,
        )
        sampling = SamplingParams(max_tokens=r.output_tokens, ignore_eos=True, temperature=0.0)
        d.clock.advance_to(max(now, d.clock.now()))
        d.core.add_request(
            GenerateRequest(request_id=r.rid, token_ids=r.prompt, sampling=sampling, kv_transfer=kt)
        )
        d.core.finish_remote_kv(r.rid, data)
        self.kick(d, now)

    def tick(self, now: float) -> None:
        """A timer a subclass scheduled with ``push(t, "tick", None)`` (benchmarks/role_sim.py)."""

    def run(self, trace: list[Req]) -> list[Req]:
        for r in trace:
            self.push(r.arrival, "arrive", r)
        while self.heap:
            now, _, kind, obj = heapq.heappop(self.heap)
            if kind == "arrive":
                self.arrive(obj, now)  # type: ignore[arg-type]
            elif kind == "step":
                self.step_end(obj, now)  # type: ignore[arg-type]
            elif kind == "tick":
                self.tick(now)
            else:
                r, kt, data = obj  # type: ignore[misc]
                self.kv_arrived(r, kt, data, now)
        return trace


def make_trace(args: argparse.Namespace, rate: float, seed: int) -> list[Req]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(args.requests):
        t += rng.expovariate(rate)
        n = rng.randint(args.isl_min, args.isl_max)
        prompt = tuple(rng.randrange(3, 40000) for _ in range(n))
        out.append(Req(f"r{i}", t, prompt, rng.randint(args.osl_min, args.osl_max)))
    return out


@dataclass(frozen=True)
class Result:
    name: str
    rate: float
    goodput: float
    ttft_p50: float
    ttft_p99: float
    tpot_p50: float
    tpot_p99: float
    met: int
    done: int


def measure(name: str, trace: list[Req], args: argparse.Namespace, rate: float) -> Result:
    done = [r for r in trace if r.finish_s >= 0]
    ttft = sorted(r.first_s - r.arrival for r in done)
    tpot = sorted((r.finish_s - r.first_s) / max(r.tokens - 1, 1) for r in done)
    met = sum(
        1
        for r in done
        if r.first_s - r.arrival <= args.ttft_slo
        and (r.finish_s - r.first_s) / max(r.tokens - 1, 1) <= args.itl_slo
    )
    span = max(r.finish_s for r in done) - min(r.arrival for r in trace)
    return Result(
        name, rate, met / span, pct(ttft, 50), pct(ttft, 99), pct(tpot, 50), pct(tpot, 99), met, len(done)
    )


def pct(xs: list[float], q: float) -> float:
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))] if xs else math.nan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", type=float, nargs="+", default=[8.0, 14.0, 20.0, 26.0, 30.0])
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--isl-min", type=int, default=3000)
    ap.add_argument("--isl-max", type=int, default=6000)
    ap.add_argument("--osl-min", type=int, default=50)
    ap.add_argument("--osl-max", type=int, default=150)
    ap.add_argument("--ttft-slo", type=float, default=2.0)
    ap.add_argument("--itl-slo", type=float, default=0.025)
    ap.add_argument("--chunk", type=int, default=2048)
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--num-blocks", type=int, default=16000)
    ap.add_argument("--kv-bytes-per-token", type=int, default=128 * 1024, help="Llama-3-8B bf16")
    ap.add_argument("--bandwidth", type=float, default=25e9)
    ap.add_argument("--rtt", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(
        f"prefill-heavy trace: ISL {args.isl_min}-{args.isl_max}, OSL {args.osl_min}-{args.osl_max}, "
        f"{args.requests} requests per rate; SLO TTFT <= {args.ttft_slo}s, TPOT <= {args.itl_slo * 1e3:.0f}ms; "
        f"link {args.bandwidth / 1e9:.0f} GB/s, KV {args.kv_bytes_per_token // 1024} KiB/token"
    )
    print(
        f"{'setup':<22} {'rate':>5} {'goodput':>8} {'met':>8} {'TTFT p50':>9} {'p99':>7} "
        f"{'TPOT p50':>9} {'p99':>7}"
    )
    for rate in args.rates:
        setups = (
            ("4 aggregated", {"prefill": 0, "decode": 0, "aggregated": 4}, False),
            ("2P+2D always remote", {"prefill": 2, "decode": 2, "aggregated": 0}, False),
            ("2P+2D conditional", {"prefill": 2, "decode": 2, "aggregated": 0}, True),
        )
        for name, shape, conditional in setups:
            args.conditional = conditional
            sim = Sim(args, **shape)
            trace = sim.run(make_trace(args, rate, args.seed))
            r = measure(name, trace, args, rate)
            extra = f"  {sim.choices}" if conditional else ""
            print(
                f"{r.name:<22} {r.rate:>5.1f} {r.goodput:>8.2f} {r.met:>4}/{r.done:<3} "
                f"{r.ttft_p50 * 1e3:>7.0f}ms {r.ttft_p99 * 1e3:>5.0f}ms "
                f"{r.tpot_p50 * 1e3:>7.1f}ms {r.tpot_p99 * 1e3:>5.1f}ms{extra}",
                flush=True,
            )


if __name__ == "__main__":
    main()
