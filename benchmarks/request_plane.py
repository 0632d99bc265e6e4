"""Request plane: NATS request/streamed reply vs a direct TCP stream between processes.

A server process serves a handler that streams 16 chunks (each an encoded one-token
``GenerateOutput``, as a worker sends) with no model time; this process calls it.
Reported per plane: requests/s at concurrency 64 and p50/p99 latency of a whole 16-chunk
stream at concurrency 1. Both planes run behind the same runtime API, discovery over NATS.

    .venv/bin/python benchmarks/request_plane.py            # both planes, uvloop
    .venv/bin/python benchmarks/request_plane.py --loop asyncio --planes tcp

Figures on the 2-core development box (shared with other jobs, load 3-5, so ±30%;
2026-12-02, three runs each; the table and the reasoning are in docs/design.md):

    plane   loop     req/s @64        p50 @1         p99 @1
    tcp     uvloop   10,400-13,700    0.09-0.10 ms   0.22-2.5 ms
    tcp     asyncio   5,600-11,200    0.12-0.15 ms   0.31-5.6 ms
    nats    uvloop    4,400-4,900     0.35-0.46 ms   0.9-5.2 ms
    nats    asyncio   2,600-5,700     0.44-0.50 ms   1.0-4.6 ms
    inproc  uvloop   31,600-35,100    0.01-0.02 ms   0.03-0.07 ms

Direct TCP wins (about 2.3x the requests/s, a quarter of the p50), so it is the default
request plane; NATS carries discovery and events.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from interlock.protocol import GenerateOutput, InstanceInfo  # noqa: E402
from interlock.runtime import (  # noqa: E402
    CallContext,
    EndpointName,
    InProcRegistry,
    NatsServer,
    Runtime,
    RuntimeConfig,
    connect_runtime,
)

ENDPOINT = EndpointName("bench", "worker", "generate")
TOKENS = 16
CHUNKS = [
    msgspec.msgpack.encode(GenerateOutput(request_id="cmpl-0123456789", token_ids=(1000 + i,)))
    for i in range(TOKENS)
]


async def handler(payload: bytes, ctx: CallContext) -> AsyncIterator[bytes]:
    for chunk in CHUNKS:
        yield chunk


def use_loop(name: str) -> None:
    if name == "uvloop":
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


async def start_server(runtime: Runtime) -> None:
    address = await runtime.requests.serve(ENDPOINT, handler, instance_id="w1")
    await runtime.discovery.register(
        InstanceInfo(instance_id="w1", endpoint=str(ENDPOINT), model="m", address=address)
    )


async def serve(nats_url: str, plane: str) -> None:
    runtime = await connect_runtime(nats_url, RuntimeConfig(request_plane=plane))  # type: ignore[arg-type]
    await start_server(runtime)
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until parent closes
    await runtime.close()


async def one_call(runtime: Runtime, address: str, payload: bytes) -> float:
    start = time.perf_counter()
    n = 0
    async for _ in runtime.requests.stream(address, payload):
        n += 1
    assert n == TOKENS
    return time.perf_counter() - start


async def latency(runtime: Runtime, address: str, n: int) -> list[float]:
    return [await one_call(runtime, address, b"x" * 64) for _ in range(n)]


async def throughput(runtime: Runtime, address: str, concurrency: int, seconds: float) -> float:
    deadline = time.perf_counter() + seconds
    done = 0

    async def client() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await one_call(runtime, address, b"x" * 64)
            done += 1

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return done / (time.perf_counter() - start)


async def measure(runtime: Runtime, args: argparse.Namespace) -> dict[str, float]:
    [instance] = await runtime.discovery.instances(ENDPOINT)
    await latency(runtime, instance.address, 200)  # warm-up: connections, caches
    await throughput(runtime, instance.address, args.concurrency, 1.0)
    lat = sorted(await latency(runtime, instance.address, args.requests))
    rps = await throughput(runtime, instance.address, args.concurrency, args.seconds)
    return {
        "rps": rps,
        "p50_ms": statistics.median(lat) * 1e3,
        "p99_ms": lat[int(len(lat) * 0.99) - 1] * 1e3,
    }


async def measure_over_nats(nats_url: str, plane: str, args: argparse.Namespace) -> dict[str, float]:
    async with await connect_runtime(nats_url, RuntimeConfig(request_plane=plane)) as runtime:  # type: ignore[arg-type]
        return await measure(runtime, args)


async def measure_in_process(args: argparse.Namespace) -> dict[str, float]:
    """Reference: server and client in this process (``interlock serve --single-process``)."""
    registry = InProcRegistry()
    async with await connect_runtime(None, registry=registry) as server:
        await start_server(server)
        async with await connect_runtime(None, registry=registry) as client:
            return await measure(client, args)


def run_plane(nats_url: str, plane: str, args: argparse.Namespace) -> dict[str, float]:
    if plane == "inproc":
        use_loop(args.loop)
        return asyncio.run(measure_in_process(args))
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", plane, "--nats-url", nats_url, "--loop", args.loop],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        use_loop(args.loop)
        return asyncio.run(measure_over_nats(nats_url, plane, args))
    finally:
        assert server.stdin is not None
        server.stdin.close()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--planes", default="tcp,nats,inproc")
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="uvloop")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--requests", type=int, default=1000, help="sequential calls for latency")
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of the throughput run")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--nats-url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        use_loop(args.loop)
        asyncio.run(serve(args.nats_url, args.serve))
        return
    print(f"{'plane':6} {'loop':8} {'req/s @' + str(args.concurrency):>12} {'p50 @1':>9} {'p99 @1':>9}")
    with NatsServer() as nats_server:
        for plane in args.planes.split(","):
            r = run_plane(nats_server.url, plane, args)
            print(
                f"{plane:6} {args.loop:8} {r['rps']:12.0f} {r['p50_ms']:7.2f}ms {r['p99_ms']:7.2f}ms",
                flush=True,
            )


if __name__ == "__main__":
    main()
