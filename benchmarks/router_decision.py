"""Router decision speed: time per routing decision and KV events applied per second.

For each (workers, indexed blocks) pair: workers publish ``BlockStored`` events of 32-block
chains (a fifth of them under one of 100 shared 8-block prefixes) until the index holds the
target number of blocks; then ``Router.route`` decides for 32-block requests (half of them a
stored chain, half new), each followed by ``on_finish`` so load stays flat. Reported: events and
blocks applied per second, and p50/p99 of the whole decision (index lookup + cost over all
workers + choice) and of the index lookup alone. Wall-clock percentiles on a shared 2-core machine
include the times the process was descheduled (a few ms, in ~1-2% of calls); the CPU-time
percentiles (``time.thread_time``) leave that out.

    .venv/bin/python benchmarks/router_decision.py [--pin] [--decisions 3000]

``--pin`` runs on one core (as the Dynamo figures in /work/shared/anchors/dynamo.md were).
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import time

import numpy as np

from interlock.protocol.discovery import InstanceInfo
from interlock.protocol.events import BlockStored, KVEventBatch
from interlock.router import RequestMeta, Router, RouterConfig

CHAIN = 32


def build(num_workers: int, num_blocks: int, rng: random.Random) -> tuple[Router, list, float]:
    r = Router(RouterConfig(block_size=16, seed=0))
    for i in range(num_workers):
        r.add_worker(
            InstanceInfo(
                instance_id=f"w{i}", endpoint="e", model="m", block_size=16, kv_blocks_total=1_000_000
            )
        )
    shared = [[rng.getrandbits(63) for _ in range(8)] for _ in range(100)]
    batches, chains = [], []
    seqs = dict.fromkeys(range(num_workers), -1)
    stored = 0
    while stored < num_blocks:
        w = rng.randrange(num_workers)
        head = rng.choice(shared) if rng.random() < 0.2 else []
        chain = head + [rng.getrandbits(63) for _ in range(CHAIN - len(head))]
        seqs[w] += 1
        batches.append(
            KVEventBatch(
                instance_id=f"w{w}",
                seq=seqs[w],
                timestamp=0.0,
                events=(BlockStored(block_hashes=tuple(chain), parent_block_hash=None),),
            )
        )
        chains.append(chain)
        stored += CHAIN
    t0 = time.perf_counter()
    for b in batches:
        r.apply_events(b)
    return r, chains, time.perf_counter() - t0


def measure(num_workers: int, num_blocks: int, decisions: int) -> dict[str, float]:
    rng = random.Random(num_workers * 7 + num_blocks)
    r, chains, apply_s = build(num_workers, num_blocks, rng)
    n_events = len(chains)
    requests = [
        rng.choice(chains) if i % 2 else [rng.getrandbits(63) for _ in range(CHAIN)] for i in range(decisions)
    ]
    gc.collect()
    gc.freeze()  # the index is long-lived; keep the collector off it, as a server would
    full, cpu, lookup = [], [], []
    for i, hashes in enumerate(requests):
        c0 = time.thread_time()
        t0 = time.perf_counter()
        d = r.route(
            RequestMeta(request_id=str(i), prompt_tokens=CHAIN * 16, max_tokens=64), block_hashes=hashes
        )
        t1 = time.perf_counter()
        c1 = time.thread_time()
        r.indexer.overlaps(hashes)
        t2 = time.perf_counter()
        full.append(t1 - t0)
        cpu.append(c1 - c0)
        lookup.append(t2 - t1)
        r.on_finish(d.request_id)
    gc.unfreeze()
    return {
        "workers": num_workers,
        "blocks": r.indexer.num_blocks(),
        "events_per_s": n_events / apply_s,
        "blocks_per_s": n_events * CHAIN / apply_s,
        "decide_p50_us": float(np.percentile(full, 50)) * 1e6,
        "decide_p99_us": float(np.percentile(full, 99)) * 1e6,
        "cpu_p50_us": float(np.percentile(cpu, 50)) * 1e6,
        "cpu_p99_us": float(np.percentile(cpu, 99)) * 1e6,
        "lookup_p50_us": float(np.percentile(lookup, 50)) * 1e6,
        "lookup_p99_us": float(np.percentile(lookup, 99)) * 1e6,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pin", action="store_true", help="run on one CPU core")
    ap.add_argument("--decisions", type=int, default=3000)
    ap.add_argument("--workers", default="64,256,1024")
    ap.add_argument("--blocks", default="100000,1000000")
    args = ap.parse_args()
    if args.pin:
        os.sched_setaffinity(0, {0})
    print(
        "| workers | indexed blocks | events/s (32 blocks each) | blocks/s | decision p50 / p99 µs "
        "(wall) | decision p50 / p99 µs (CPU) | lookup p50 / p99 µs |"
    )
    print("|---|---|---|---|---|---|---|")
    for w in (int(x) for x in args.workers.split(",")):
        for b in (int(x) for x in args.blocks.split(",")):
            m = measure(w, b, args.decisions)
            print(
                f"| {m['workers']} | {m['blocks']:,} | {m['events_per_s']:,.0f} | "
                f"{m['blocks_per_s']:,.0f} | {m['decide_p50_us']:.0f} / {m['decide_p99_us']:.0f} | "
                f"{m['cpu_p50_us']:.0f} / {m['cpu_p99_us']:.0f} | "
                f"{m['lookup_p50_us']:.0f} / {m['lookup_p99_us']:.0f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
