"""What a worker's whole KV state costs to hand over and to hold, at fleet scale.

    PYTHONPATH=. .venv/bin/python benchmarks/index_costs.py [--workers 300] [--blocks 30000] [--repeats 5]

Three figures, each the median of ``--repeats`` runs, on this machine (the CPU is printed):

* **engine side**: a ``BlockPool`` holding ``--blocks`` cached blocks hands a router its state as
  block hashes (``cached_hashes``, what ``EngineCore.kv_state`` reads on the engine's step thread
  for a pull) against the snapshot's events (``snapshot``: a ``BlockStored`` per block with its
  parent and tokens, sorted by depth, what a pull read before);
* **router side**: one worker's snapshot of ``--blocks`` blocks, decoded from its parts and
  applied to a router's index (``KvSync``'s work for a pull, on the serving loop);
* **loading a fleet**: ``--workers`` states of ``--blocks`` blocks each applied as a fresh
  router pulls them (``load_state``, a slice per turn of the loop): its longest turn, the
  longest whole state and the total, while the map grows from 1,024 slots to tens of millions
  (it grows a few slots per store, its next table prepared by a thread: a growth used to be
  one call, 284 ms at 6.3 M entries);
* **a replica's copy**: the same states exported by that router (``KvIndexer.export``, what
  ``kv_replica`` serves a second frontend) and loaded into a fresh one: the blocks come in the
  order of the index's own per-worker sets, which once piled a growing set into one long run
  (8x the time of the same blocks in a worker's order);
* **garbage collection**: one full ``gc.collect()`` while a router's index holds ``--workers``
  x ``--blocks`` blocks (each worker's block set a dict of ints, which the collector does not
  track) against the same blocks held as one Python ``set`` per worker, as the index did before
  (a tracked container whose every item a full collection visits). Every request in flight
  waits out a full collection.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import subprocess
import time
from array import array
from collections.abc import Callable, Mapping, Sequence

import msgspec

from interlock.engine.block_pool import BlockPool
from interlock.protocol import InstanceInfo, subjects
from interlock.protocol.kv_sync import KvSnapshotPart, snapshot_parts, unpack_hashes
from interlock.router.kv_sync import _decode_part
from interlock.router.model_router import Router, RouterConfig


def _load(r: Router, wid: str, seq: int, by_tier: Mapping[str, Sequence[int]]) -> None:
    """A pulled state applied whole (its slices one after another, as the loop would)."""
    for _ in r.load_state(wid, seq, by_tier):
        pass


def median_s(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def cpu_model() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    return next(
        (line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "?"
    )


def engine_side(blocks: int, repeats: int) -> tuple[float, float]:
    pool = BlockPool(blocks + 1, 16)
    rng = random.Random(0)
    for _ in range(blocks // 32):
        ids = pool.allocate(32)
        pool.cache_blocks(ids, [rng.getrandbits(64) for _ in range(32)], 0, 32)
        pool.free(ids)
    return median_s(pool.snapshot, repeats), median_s(pool.cached_hashes, repeats)


def _router(workers: int) -> Router:
    r = Router(RouterConfig())
    for w in range(workers):
        r.add_worker(
            InstanceInfo(
                instance_id=f"w{w}", endpoint=subjects.GENERATE_ENDPOINT, model="m", address="inproc://x"
            )
        )
    return r


def router_side(blocks: int, repeats: int) -> float:
    r = _router(1)
    rng = random.Random(1)
    encode = msgspec.msgpack.Encoder().encode
    frames = [encode(p) for p in snapshot_parts({"device": [rng.getrandbits(64) for _ in range(blocks)]})]
    seq = iter(range(1 << 30))

    def pull() -> None:
        by_tier: dict[str, array[int]] = {}
        for frame in frames:
            part: KvSnapshotPart = _decode_part(frame)
            by_tier[part.tier] = unpack_hashes(part.hashes, by_tier.get(part.tier))
        _load(r, "w0", next(seq), by_tier)

    return median_s(pull, repeats)


def longest_steps(r: Router, workers: int, blocks: int) -> tuple[float, float, float]:
    """``workers`` states of ``blocks`` blocks loaded into ``r`` as the serving loop does, a
    slice (``STATE_STEP`` blocks) per turn: the longest turn, the longest whole state, and the
    whole load's time. The map grows as it fills (from 1,024 slots to tens of millions)."""
    rng = random.Random(2)
    longest_turn = longest_state = total = 0.0
    for w in range(workers):
        state = {"device": [rng.getrandbits(64) for _ in range(blocks)]}
        spent = 0.0
        steps, end = r.load_state(f"w{w}", 0, state), object()
        while True:
            t = time.perf_counter()
            got = next(steps, end)
            dt = time.perf_counter() - t
            spent += dt
            longest_turn = max(longest_turn, dt)
            if got is end:
                break
        longest_state, total = max(longest_state, spent), total + spent
    return longest_turn, longest_state, total


def replica_copy(r: Router, workers: int) -> float:
    """Every worker's state in ``r`` copied into a fresh router as a second frontend copies it
    from a replica (``KvIndexer.export``: the blocks in the order of the index's own sets)."""
    fresh = _router(workers)
    exports = [r.indexer.export(f"w{w}") for w in range(workers)]
    t = time.perf_counter()
    for w, (seq, by_tier) in enumerate(e for e in exports if e is not None):
        _load(fresh, f"w{w}", seq, by_tier)
    return time.perf_counter() - t


def collection(
    workers: int, blocks: int, repeats: int
) -> tuple[float, float, tuple[float, float, float], float]:
    r = _router(workers)
    steps = longest_steps(r, workers, blocks)
    copy_s = replica_copy(r, workers)
    with_dicts = median_s(gc.collect, repeats)
    as_sets = [set(r.indexer.blocks_of(f"w{w}")) for w in range(workers)]  # the old representation
    with_sets = median_s(gc.collect, repeats)
    del as_sets
    return with_dicts, with_sets, steps, copy_s


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=300)
    p.add_argument("--blocks", type=int, default=30_000)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    events_s, hashes_s = engine_side(a.blocks, a.repeats)
    apply_s = router_side(a.blocks, a.repeats)
    dicts_s, sets_s, (turn_s, state_s, load_s), copy_s = collection(a.workers, a.blocks, a.repeats)
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {cpu_model()}; median of {a.repeats}\n")
    print("| figure | ms |\n|---|---|")
    print(f"| engine: {a.blocks:,} blocks as snapshot events (before) | {events_s * 1e3:.1f} |")
    print(f"| engine: {a.blocks:,} blocks as hashes (`kv_state`) | {hashes_s * 1e3:.1f} |")
    print(f"| router: decode and apply one {a.blocks:,}-block snapshot | {apply_s * 1e3:.1f} |")
    print(
        f"| router: {a.workers} x {a.blocks:,} blocks loaded, the longest turn (a slice) | {turn_s * 1e3:.1f} |"
    )
    print(f"| router: the same, the longest whole state | {state_s * 1e3:.1f} |")
    print(f"| router: the same, all of it | {load_s * 1e3:.0f} |")
    print(
        f"| router: the same copied from a replica's export into a fresh one, all of it | {copy_s * 1e3:.0f} |"
    )
    print(f"| full GC, {a.workers} x {a.blocks:,} blocks as sets (before) | {sets_s * 1e3:.1f} |")
    print(f"| full GC, {a.workers} x {a.blocks:,} blocks in the index now | {dicts_s * 1e3:.1f} |")


if __name__ == "__main__":
    main()
