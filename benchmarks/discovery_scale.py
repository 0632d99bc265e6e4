"""A fleet of N workers joining and leaving one router, in process: how long discovery and the
router service take to process every join and every leave (the spread of a fleet's joins).

    PYTHONPATH=. .venv/bin/python benchmarks/discovery_scale.py [--sizes 1000,3000,10000]

Each worker registers through the in-process discovery (its lease table and watch stream, as
over NATS) and the router service takes it in (filed under its model and card, added to the
model's router); the loop yields after each registration so every join is processed on its own,
as announcements arriving one by one are. Then every worker unregisters the same way. Per size:
seconds from the first join to the last one processed, microseconds per join overall and over
the last tenth (flat when a join costs the same at any size), the same for leaves. No NATS, no
engine: this is the control plane's own work per join, nothing else.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time

from interlock.protocol import InstanceInfo, subjects
from interlock.router.service import RouterService
from interlock.runtime import InProcRegistry, RuntimeConfig, connect_runtime

CFG = RuntimeConfig(heartbeat_interval=60.0, lease_timeout=120.0)
"""No heartbeat or expiry falls inside a run."""


def worker(i: int) -> InstanceInfo:
    wid = f"w{i:06d}"
    return InstanceInfo(
        instance_id=wid,
        endpoint=subjects.GENERATE_ENDPOINT,
        model="m",
        address=f"inproc://{subjects.GENERATE_ENDPOINT}.{wid}",
        block_size=16,
        kv_blocks_total=1024,
        publishes_kv_events=False,
    )


async def run(n: int) -> tuple[list[float], list[float]]:
    """Seconds from the start to each join processed, then to each leave processed."""
    registry = InProcRegistry()
    runtime = await connect_runtime(None, CFG, registry=registry)
    svc = RouterService(discovery=runtime.discovery, requests=runtime.requests, events=runtime.events)
    await svc.start()
    await asyncio.sleep(0)  # the service's watch is open
    infos = [worker(i) for i in range(n)]
    joins: list[float] = []
    leaves: list[float] = []
    try:
        t0 = time.perf_counter()
        for info in infos:
            await runtime.discovery.register(info)
            await asyncio.sleep(0)  # the service takes this join in
            joins.append(time.perf_counter() - t0)
        assert all(svc.instance(i.instance_id) is not None for i in infos), "a join was not processed"
        t0 = time.perf_counter()
        for info in infos:
            await runtime.discovery.unregister(info.instance_id)
            await asyncio.sleep(0)
            leaves.append(time.perf_counter() - t0)
        assert not svc.instances(), "a leave was not processed"
    finally:
        await svc.close()
        await runtime.close()
        registry.leases.close()
    return joins, leaves


def per_us(stamps: list[float], since: int) -> float:
    """Microseconds per event from event ``since`` on."""
    start = stamps[since - 1] if since else 0.0
    return (stamps[-1] - start) / (len(stamps) - since) * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1000,3000,10000", help="fleet sizes, comma separated")
    a = p.parse_args()
    print(
        f"{'N':>7} {'joins s':>9} {'us/join':>9} {'last 10%':>9} {'leaves s':>9} {'us/leave':>9} {'last 10%':>9}"
    )
    for n in (int(s) for s in a.sizes.split(",")):
        gc.collect()
        joins, leaves = asyncio.run(run(n))
        tail = n - n // 10
        print(
            f"{n:>7} {joins[-1]:>9.3f} {per_us(joins, 0):>9.1f} {per_us(joins, tail):>9.1f}"
            f" {leaves[-1]:>9.3f} {per_us(leaves, 0):>9.1f} {per_us(leaves, tail):>9.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
