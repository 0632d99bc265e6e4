"""Start-up cost: seconds from adding a worker to it serving, per engine, through the Python API.

    .venv/bin/python benchmarks/startup_cost.py [--repeats 3] [--engines mock,torch,vllm]

For each engine (the mock runner; Interlock's CPU engine with the default model, SmolLM2-135M;
vLLM's CPU build when ``import vllm`` works here, else skipped with a message) it starts a
serving instance of one worker, then ``repeats`` times grows it to two with ``scale_to(2)``,
which returns once the new worker is registered with the router (the add-to-serving time the
planner's start-up estimate measures), and shrinks it back. It prints, per engine, the
median, min and max of those times, the builder's smoothed estimate
(``RunningCluster.startup_s``: what ``ClusterFleet.capacity().startup_s`` reports), the new
worker's resident memory once serving, and, for the mock runner, the CPU share a worker uses
while it streams 64 requests (what ``cluster.spec.MOCK_CORES`` is sized from).

Run it on a quiet machine: start-up is mostly loading (imports, weights, vLLM's profiling run),
and other work on the cores stretches it.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import interlock
from interlock.cluster.builder import WorkerHandle

CLK = os.sysconf("SC_CLK_TCK")


@dataclass
class Row:
    engine: str
    times: list[float]
    estimate: float
    rss_mib: float
    cpu_cores: float | None = None


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK  # utime + stime


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def pid_of(handle: WorkerHandle) -> int:
    assert handle.child is not None and handle.child.pid is not None
    return handle.child.pid


def mock_cpu_share(instance: interlock.ServingInstance, seconds: float = 5.0) -> float:
    """Cores one mock worker uses while it streams 64 requests at once."""
    [handle] = instance.workers
    pid = pid_of(handle)

    async def load() -> float:
        stop = time.monotonic() + seconds + 1.0

        async def client() -> None:
            while time.monotonic() < stop:
                await instance.agenerate([5, 6, 7, 8], max_tokens=64, temperature=0, ignore_eos=True)

        tasks = [asyncio.create_task(client()) for _ in range(64)]
        await asyncio.sleep(1.0)  # in full flow
        c0, t0 = cpu_seconds(pid), time.monotonic()
        await asyncio.sleep(seconds)
        share = (cpu_seconds(pid) - c0) / (time.monotonic() - t0)
        await asyncio.gather(*tasks)
        return share

    return asyncio.run(load())


def measure(cluster: interlock.Cluster, engine: str, repeats: int) -> Row:
    model = f"m-{engine}"
    if engine == "mock":
        cluster.register_model(model, "smollm2", runner="mock", max_model_len=512)
    elif engine == "torch":
        cluster.register_model(model, "smollm2", runner="torch", max_model_len=2048)
    else:
        cluster.register_model(model, "smollm2", engine="vllm", max_model_len=2048)
    instance = cluster.create_serving_instance(model=model, min_replicas=1, max_replicas=2, kv_cache_gib=0.25)
    try:
        cpu = mock_cpu_share(instance) if engine == "mock" else None
        times, rss = [], 0.0
        for _ in range(repeats):
            t0 = time.perf_counter()
            instance.scale_to(2)
            times.append(time.perf_counter() - t0)
            rss = rss_mib(pid_of(instance.workers[-1]))
            instance.scale_to(1)
        return Row(engine, times, cluster.running.startup_s(instance.group), rss, cpu)
    finally:
        instance.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--engines", default="mock,torch,vllm")
    a = p.parse_args()
    engines = a.engines.split(",")
    if "vllm" in engines and importlib.util.find_spec("vllm") is None:
        print("vllm: not installed in this environment (pip install vllm, CPU build): skipped")
        engines.remove("vllm")
    rows = []
    with interlock.Cluster.local(heartbeat_interval=0.5) as cluster:
        print(f"host: {cluster.running.host}")
        for engine in engines:
            try:
                rows.append(measure(cluster, engine, a.repeats))
            except Exception as e:  # noqa: BLE001 - one engine failing still reports the others
                print(f"{engine}: failed: {e}")
    print(
        f"\n{'engine':8} {'n':>2} {'median s':>9} {'min s':>7} {'max s':>7} {'smoothed s':>11} {'RSS MiB':>8} cores"
    )
    for r in rows:
        cores = f"{r.cpu_cores:.2f}" if r.cpu_cores is not None else "-"
        print(
            f"{r.engine:8} {len(r.times):>2} {statistics.median(r.times):>9.2f} {min(r.times):>7.2f} "
            f"{max(r.times):>7.2f} {r.estimate:>11.2f} {r.rss_mib:>8.0f} {cores}"
        )


if __name__ == "__main__":
    main()
