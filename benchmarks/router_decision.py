"""Router decision speed: CPU time per routing decision, per part, and KV events applied per second.

For each (workers, indexed blocks) pair the index is filled by ``BlockStored`` events the way a
chat deployment fills it: 100 system prompts of 32-128 blocks (512-2,048 tokens), each cached
on a random 5-50% of the workers (fewer at 1,024 workers, where that would be most
of the index: 7-65 there), and conversations (an optional system prompt plus 16-192
blocks of history) each cached on one worker (a tenth also on a second one), until the index
holds the target number of blocks. Block size 16.

Then ``Router.route`` decides for requests of three kinds, in turn: the next turn of a stored
conversation (its whole history, cached on one or two workers, plus 2-32 new blocks), a new
conversation on a system prompt (a prefix cached on many workers, plus 16-160 new blocks), and
a prompt nobody holds (16-256 blocks); prompts are 256-4,096 tokens, outputs 32-1,024 tokens.
Load moves as in a running deployment: about two requests per worker are in flight (each
decision's request gets its first token and finishes a few decisions later), and before each
decision four random workers send a ``LoadReport`` (KV 20-95% used, a prefill queue, step
times that fit the speed lines; every worker has sent eight before the first decision, so each
has its speed line, as in a deployment that has run for a while). None of that is timed; only
the ``route`` call is.

Reported (CPU time, ``time.thread_time_ns``, so time the process spent descheduled is left
out; each figure includes one reading of the clock, printed first as an empty interval):
p50/p99 of the whole decision, and per part: the prefix lookup alone
(``KvIndexer.overlaps``, timed separately on the same prompt) and the rest (per-worker vectors,
cost over every worker, choice, dispatch accounting), as whole minus lookup per decision. With
the compiled index (``router.native``, the default where it builds) the decision's own lookup
runs inside its one compiled call and is not timed apart; the lookup column then times the
index's API (the compiled lookup and the runs handed to Python as ints, an upper bound on the
decision's share), and "rest" is the whole minus that. ``INTERLOCK_CPU_KERNELS=0`` runs the
Python index and numpy (the reference path).

    PYTHONPATH=. .venv/bin/python benchmarks/router_decision.py [--pin] [--decisions 3000]
        [--workers 8,128,1024] [--blocks 1000000] [--reports 100000]

``--reports N`` times ``Router.apply_load`` instead: CPU µs per load report (and reports per
second) over a stream of N reports from ``Fleet.report``, every worker's line already fitted.

``--pin`` runs on one core (as the Dynamo figures in /work/shared/anchors/dynamo.md were).
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import time
from collections import deque
from collections.abc import Iterator

import numpy as np
from msgspec.structs import replace

from interlock.protocol.discovery import InstanceInfo
from interlock.protocol.events import BlockStored, KVEventBatch, LoadReport
from interlock.router import Decision, Pending, RequestMeta, Router, RouterConfig

BLOCK = 16
REPORTS_PER_DECISION = 4


class Fleet:
    """The workers' side: what each has cached, sequence numbers, load reports."""

    def __init__(self, num_workers: int, num_blocks: int, rng: random.Random) -> None:
        self.rng = rng
        self.n = num_workers
        self.capacity = max(num_blocks // num_workers * 2, 4096)
        self.seqs = [-1] * num_workers
        self.batches: list[KVEventBatch] = []
        self.systems = [[rng.getrandbits(63) for _ in range(rng.randint(32, 128))] for _ in range(100)]
        self.conversations: list[list[int]] = []
        stored = 0
        # each on 5-50% of the workers, fewer where that would fill most of the index
        share = min(0.275, 0.3 * num_blocks / (sum(map(len, self.systems)) * num_workers))
        for prefix in self.systems:
            k = max(1, int(num_workers * share * rng.uniform(0.2, 1.8)))
            for w in rng.sample(range(num_workers), k):
                stored += self._store(w, prefix)
        while stored < num_blocks:
            head = rng.choice(self.systems) if rng.random() < 0.7 else []
            chain = head + [rng.getrandbits(63) for _ in range(rng.randint(16, 192))]
            self.conversations.append(chain)
            w = rng.randrange(num_workers)
            stored += self._store(w, chain[len(head) :], head[-1] if head else None)
            if rng.random() < 0.1:
                stored += self._store((w + 1) % num_workers, chain[len(head) :], head[-1] if head else None)

    def _store(self, w: int, hashes: list[int], parent: int | None = None) -> int:
        self.seqs[w] += 1
        ev = BlockStored(block_hashes=tuple(hashes), parent_block_hash=parent)
        self.batches.append(KVEventBatch(instance_id=f"w{w}", seq=self.seqs[w], timestamp=0.0, events=(ev,)))
        return len(hashes)

    def request(self, i: int) -> tuple[list[int], int, int]:
        """(block hashes, prompt tokens, max tokens) of the i-th request."""
        rng = self.rng
        kind = i % 3
        if kind == 0:
            hashes = rng.choice(self.conversations)[:240] + [
                rng.getrandbits(63) for _ in range(rng.randint(2, 32))
            ]
        elif kind == 1:
            hashes = rng.choice(self.systems) + [rng.getrandbits(63) for _ in range(rng.randint(16, 160))]
        else:
            hashes = [rng.getrandbits(63) for _ in range(rng.randint(16, 256))]
        hashes = hashes[:256]
        return hashes, len(hashes) * BLOCK - rng.randrange(BLOCK), rng.randint(32, 1024)

    def report(self, w: int, now: float) -> LoadReport:
        rng = self.rng
        tokens = rng.randint(64, 8192)
        return LoadReport(
            instance_id=f"w{w}",
            timestamp=now,
            num_running=rng.randint(1, 64),
            num_waiting=rng.randint(0, 3),
            kv_blocks_used=int(self.capacity * rng.uniform(0.2, 0.95)),
            kv_blocks_total=self.capacity,
            queued_prefill_tokens=rng.choice((0, 0, rng.randint(1, 20_000))),
            step_time_s=0.01 + tokens * 2e-5 * rng.uniform(0.9, 1.1),
            tokens_computed=tokens,
            decode_step_s=rng.uniform(0.01, 0.04),
        )


def build(num_workers: int, num_blocks: int, rng: random.Random) -> tuple[Router, Fleet, float]:
    fleet = Fleet(num_workers, num_blocks, rng)
    r = Router(RouterConfig(block_size=BLOCK, seed=0, share_load=False))
    for i in range(num_workers):
        r.add_worker(
            InstanceInfo(
                instance_id=f"w{i}", endpoint="e", model="m", block_size=BLOCK, kv_blocks_total=fleet.capacity
            )
        )
    t0 = time.perf_counter()
    for b in fleet.batches:
        r.apply_events(b)
    return r, fleet, time.perf_counter() - t0


def prepare(
    num_workers: int, num_blocks: int, decisions: int
) -> tuple[Router, Fleet, random.Random, list[tuple[list[int], int, int]], float, float, int, int]:
    """The filled index, the requests to route, and every worker's speed line fitted (eight
    reports each, the last at the returned time); the index frozen out of the garbage collector,
    as a server would."""
    rng = random.Random(num_workers * 7 + num_blocks)
    r, fleet, apply_s = build(num_workers, num_blocks, rng)
    blocks_applied = sum(len(b.events[0].block_hashes) for b in fleet.batches)  # type: ignore[attr-defined]
    n_batches = len(fleet.batches)
    fleet.batches.clear()
    requests = [fleet.request(i) for i in range(decisions)]
    gc.collect()
    gc.freeze()
    now = 0.0
    for _ in range(8):
        for w in range(num_workers):
            now += 1e-6
            r.apply_load(fleet.report(w, now))
    return r, fleet, rng, requests, now, apply_s, blocks_applied, n_batches


def drive(
    r: Router, fleet: Fleet, rng: random.Random, requests: list[tuple[list[int], int, int]], now: float
) -> Iterator[tuple[int, list[int], Decision | Pending, int]]:
    """Route each request as load moves (reports before it, first tokens and finishes a few
    decisions later); yields (index, hashes, decision, CPU ns of ``route`` alone). A queued
    request is cancelled after it is yielded."""
    num_workers = fleet.n
    inflight: deque[str] = deque()
    started: deque[str] = deque()
    for i, (hashes, prompt, max_tokens) in enumerate(requests):
        now += 1e-3
        for w in rng.sample(range(num_workers), min(REPORTS_PER_DECISION, num_workers)):
            r.apply_load(fleet.report(w, now))
        while len(started) > num_workers // 2:
            r.on_first_token(started.popleft())
        while len(inflight) > 2 * num_workers:
            r.on_finish(inflight.popleft())
        meta = RequestMeta(request_id=str(i), prompt_tokens=prompt, max_tokens=max_tokens)
        c0 = time.thread_time_ns()
        d = r.route(meta, block_hashes=hashes)
        c1 = time.thread_time_ns()
        yield i, hashes, d, c1 - c0
        if isinstance(d, Pending):
            r.cancel(meta.request_id)
            continue
        inflight.append(d.request_id)
        started.append(d.request_id)


def measure(num_workers: int, num_blocks: int, decisions: int) -> dict[str, float]:
    r, fleet, rng, requests, now, apply_s, blocks_applied, n_batches = prepare(
        num_workers, num_blocks, decisions
    )
    whole, lookup = [], []
    queued = 0
    for _, hashes, d, cpu_ns in drive(r, fleet, rng, requests, now):
        if isinstance(d, Pending):
            queued += 1
            continue
        c1 = time.thread_time_ns()
        r.indexer.overlaps(hashes)
        c2 = time.thread_time_ns()
        whole.append(cpu_ns)
        lookup.append(c2 - c1)
    gc.unfreeze()
    w_us, l_us = np.array(whole) / 1e3, np.array(lookup) / 1e3
    rest = w_us - l_us
    return {
        "workers": num_workers,
        "blocks": r.indexer.num_blocks(),
        "events_per_s": n_batches / apply_s,
        "blocks_per_s": blocks_applied / apply_s,
        "p50": float(np.percentile(w_us, 50)),
        "p99": float(np.percentile(w_us, 99)),
        "lookup_p50": float(np.percentile(l_us, 50)),
        "lookup_p99": float(np.percentile(l_us, 99)),
        "rest_p50": float(np.percentile(rest, 50)),
        "rest_p99": float(np.percentile(rest, 99)),
        "queued": queued,
    }


def measure_reports(num_workers: int, num_reports: int) -> dict[str, float]:
    """CPU time of ``Router.apply_load`` over a stream of ``num_reports`` reports from random
    workers (built ahead, not timed), after every worker's speed line is fitted; no blocks are
    indexed (a report does not read the index). Best of three passes over the same stream."""
    r, fleet, rng, _, now, *_ = prepare(num_workers, 0, 0)
    stream = []
    for _ in range(num_reports):
        now += 1e-4
        stream.append(fleet.report(rng.randrange(num_workers), now))
    apply = r.apply_load
    best = float("inf")
    for k in range(3):
        # each pass a little later, so no report is dropped as older than the last one
        batch = [replace(rep, timestamp=rep.timestamp + k * (now + 1.0)) for rep in stream]
        c0 = time.thread_time_ns()
        for rep in batch:
            apply(rep)
        best = min(best, (time.thread_time_ns() - c0) / 1e3 / num_reports)
    gc.unfreeze()
    return {"workers": num_workers, "us_per_report": best, "reports_per_s": 1e6 / best}


def empty_interval_us(n: int = 3000) -> float:
    """p50 of ``thread_time_ns() - thread_time_ns()`` with nothing between: what reading the
    clock itself adds to each timed decision (a system call on some VMs, about 3 µs here)."""
    clock = time.thread_time_ns
    gaps = []
    for _ in range(n):
        c0 = clock()
        gaps.append(clock() - c0)
    return float(np.percentile(gaps, 50)) / 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pin", action="store_true", help="run on one CPU core")
    ap.add_argument("--decisions", type=int, default=3000)
    ap.add_argument("--workers", default="8,128,1024")
    ap.add_argument("--blocks", default="1000000")
    ap.add_argument(
        "--reports",
        type=int,
        default=0,
        help="time applying this many load reports instead (µs per report; no decisions)",
    )
    args = ap.parse_args()
    if args.pin:
        os.sched_setaffinity(0, {0})
    if args.reports:
        print("| workers | load report µs (CPU) | reports/s |")
        print("|---|---|---|")
        for w in (int(x) for x in args.workers.split(",")):
            m = measure_reports(w, args.reports)
            print(f"| {w:,} | {m['us_per_report']:.2f} | {m['reports_per_s']:,.0f} |", flush=True)
        return
    print(f"index: {'compiled' if Router().indexer.compiled else 'Python dict'}")
    print(f"clock: an empty interval reads {empty_interval_us():.1f} µs p50 (in every figure below)\n")
    print(
        "| workers | indexed blocks | batches/s | blocks/s | decision p50 / p99 µs (CPU) "
        "| lookup p50 / p99 µs | rest p50 / p99 µs | queued |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for w in (int(x) for x in args.workers.split(",")):
        for b in (int(x) for x in args.blocks.split(",")):
            m = measure(w, b, args.decisions)
            print(
                f"| {m['workers']:,} | {m['blocks']:,} | {m['events_per_s']:,.0f} | {m['blocks_per_s']:,.0f} | "
                f"{m['p50']:.0f} / {m['p99']:.0f} | {m['lookup_p50']:.0f} / {m['lookup_p99']:.0f} | "
                f"{m['rest_p50']:.0f} / {m['rest_p99']:.0f} | {m['queued']} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
