"""Synthetic workers for ``fleet_scale.py``: real ``Worker`` s around a ``FakeEngine`` whose
cache is pre-filled, many per process, on a real nats-server.

    python benchmarks/fleet_workers.py < launch.json     # a FleetLaunch as JSON on stdin

Each worker is the product's ``interlock.engine.worker.Worker`` (registration, heartbeats,
generate over the TCP request plane, KV events, load reports, snapshots on re-sync requests)
around ``SyntheticEngine``: the deterministic ``FakeEngine`` whose cache is filled before the
worker starts, by serving the worker's own prompts (``chain_tokens``) while nobody listens, so
that its ``kv_snapshot`` is as large as a real engine's full cache (``FakeEngine.fill`` would
store hashes without their tokens: 98 bytes a block in a snapshot instead of 148). Requests
that end in ``PROBE_TOKEN`` are served without storing anything: the benchmark asks the router
where such a prompt goes without changing where its prefix is held.

``conns``: ``worker`` gives every worker its own runtime (its own NATS connection and TCP
request-plane listener), as one worker per process has in production; ``process`` shares one
runtime among the workers of a process (one NATS connection, one listener).

The process prints ``ready N`` once its N workers are registered, then serves until SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from functools import cached_property

import msgspec
import numpy as np

from interlock.engine.serving import FakeEngine
from interlock.engine.worker import Worker, WorkerOptions
from interlock.protocol import (
    GenerateOutput,
    GenerateRequest,
    InstanceInfo,
    KVEventBatch,
    SamplingParams,
    subjects,
)
from interlock.runtime import connect_runtime
from interlock.runtime.config import RuntimeConfig
from interlock.runtime.runtime import Runtime

VOCAB = 49152
"""SmolLM2's vocabulary: the frontend refuses prompt ids at or above its tokenizer's size."""
PROBE_TOKEN = VOCAB - 1
"""A prompt ending in it is routed and served but never stored (chains never contain it)."""
_TOKENS = list(range(VOCAB))
"""Interned token ids: a cache of millions of blocks shares these int objects."""


@dataclass(frozen=True)
class ChainShape:
    """How a worker's synthetic cache is laid out: ``blocks`` blocks in chains (prompts) of
    ``chain_blocks`` blocks; every chain starts with one of ``system_prompts`` shared prefixes
    of ``shared_blocks`` blocks (the same on every worker, like a deployment's system prompts)."""

    blocks: int
    chain_blocks: int = 32
    shared_blocks: int = 4
    system_prompts: int = 8
    block_size: int = 16
    seed: int = 0

    @cached_property
    def lengths(self) -> tuple[int, ...]:
        """Blocks of each chain: chains of ``chain_blocks`` until ``blocks`` are stored (a
        system prefix is stored once per worker; the last chain may be cut short)."""
        out: list[int] = []
        stored = 0
        unique = self.chain_blocks - self.shared_blocks
        while stored < self.blocks:
            first_use = self.shared_blocks if len(out) < self.system_prompts else 0
            room = self.blocks - stored - first_use
            if room <= 0:
                break
            out.append(self.shared_blocks + min(unique, room))
            stored += first_use + min(unique, room)
        return tuple(out)

    @property
    def num_chains(self) -> int:
        return len(self.lengths)


def _random_tokens(key: Sequence[int], n: int) -> list[int]:
    """``n`` token ids in 1..VOCAB-2, a pure function of ``key``."""
    arr = np.random.default_rng(list(key)).integers(1, VOCAB - 1, size=n)
    return [_TOKENS[t] for t in arr.tolist()]


def chain_tokens(shape: ChainShape, worker: int, chain: int) -> list[int]:
    """The prompt that put chain ``chain`` into worker ``worker``'s cache."""
    system = _random_tokens(
        (shape.seed, 1, chain % shape.system_prompts), shape.shared_blocks * shape.block_size
    )
    unique = (shape.lengths[chain] - shape.shared_blocks) * shape.block_size
    return system + _random_tokens((shape.seed, 2, worker, chain), unique)


class SyntheticEngine(FakeEngine):
    """``FakeEngine`` with a pre-filled cache and prompts that are routed but not stored."""

    async def fill_prompts(self, prompts: Sequence[list[int]]) -> None:
        """Serve ``prompts`` before ``start``: their blocks are cached, no event leaves."""
        for i, prompt in enumerate(prompts):
            req = GenerateRequest(
                request_id=f"fill-{i}", token_ids=tuple(prompt), sampling=SamplingParams(max_tokens=1)
            )
            async for _ in super().generate(req):
                pass

    async def generate(self, req: GenerateRequest) -> AsyncGenerator[GenerateOutput, None]:
        if not req.token_ids or req.token_ids[-1] != PROBE_TOKEN:
            async for out in super().generate(req):
                yield out
            return
        for i in range(req.sampling.max_tokens):
            yield GenerateOutput(
                request_id=req.request_id,
                token_ids=(1 + i,),
                finish_reason="length" if i + 1 == req.sampling.max_tokens else None,
                num_prompt_tokens=len(req.token_ids),
            )


SPARE_BLOCKS = 1024
"""Free blocks a synthetic worker has at least beside its filled cache. The load stores new
blocks (prompt tails, replies, prefixes routed away from their holder) and nothing touches the
probed chains (probes store nothing), so once the free blocks run out the oldest chain, the one
every convergence probes, is evicted first: at the tests' 64 blocks, 64 spare blocks ran out
within a minute on a loaded machine and a phase never converged."""


def synthetic_engine(shape: ChainShape, step_s: float = 0.001) -> SyntheticEngine:
    """An empty engine for ``shape``'s cache, with room for as many new blocks again (at
    least ``SPARE_BLOCKS``)."""
    spare = max(shape.blocks, SPARE_BLOCKS)
    return SyntheticEngine(block_size=shape.block_size, num_blocks=shape.blocks + spare, step_s=step_s)


async def snapshot_bytes(shape: ChainShape) -> int:
    """The size of one worker's snapshot message (worker 0's cache, as the
    engine lists it; one NATS message where snapshots are published on the event plane)."""
    engine = synthetic_engine(shape)
    await engine.fill_prompts([chain_tokens(shape, 0, c) for c in range(shape.num_chains)])
    batch = KVEventBatch(
        instance_id=worker_id(0),
        seq=0,
        timestamp=time.time(),
        events=tuple(await engine.kv_snapshot()),
        snapshot=True,
    )
    return len(msgspec.msgpack.encode(batch))


class FleetLaunch(msgspec.Struct, frozen=True, kw_only=True):
    """What one fleet process runs (JSON on its stdin)."""

    nats_url: str
    first: int
    """Index of its first worker (worker ids are ``fleet-w<index>``)."""
    count: int
    shape: ChainShape
    model: str
    model_path: str
    conns: str = "worker"
    step_s: float = 0.001
    heartbeat_interval: float = 1.0
    lease_timeout: float = 5.0
    start_concurrency: int = 16


def worker_id(index: int) -> str:
    return f"fleet-w{index:05d}"


async def _start_one(
    launch: FleetLaunch, index: int, shared: Runtime | None
) -> tuple[Worker, Runtime | None]:
    shape = launch.shape
    engine = synthetic_engine(shape, launch.step_s)
    await engine.fill_prompts([chain_tokens(shape, index, c) for c in range(shape.num_chains)])
    own = None
    if shared is None:
        own = await connect_runtime(launch.nats_url, _runtime_config(launch), name=worker_id(index))
    runtime = shared or own
    assert runtime is not None
    info = InstanceInfo(
        instance_id=worker_id(index),
        endpoint=subjects.GENERATE_ENDPOINT,
        model=launch.model,
        model_path=launch.model_path,
        block_size=shape.block_size,
        kv_blocks_total=engine.kv_blocks_total,
        context_length=engine.context_length,
    )
    worker = Worker(
        engine,
        info,
        discovery=runtime.discovery,
        requests=runtime.requests,
        events=runtime.events,
        options=WorkerOptions(drain_grace_s=0.0),
    )
    await worker.start()
    return worker, own


def _runtime_config(launch: FleetLaunch) -> RuntimeConfig:
    return RuntimeConfig(heartbeat_interval=launch.heartbeat_interval, lease_timeout=launch.lease_timeout)


async def run_fleet(launch: FleetLaunch) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    shared = None
    if launch.conns == "process":
        shared = await connect_runtime(
            launch.nats_url, _runtime_config(launch), name=f"fleet-p{launch.first}"
        )
    started: list[tuple[Worker, Runtime | None]] = []
    gate = asyncio.Semaphore(launch.start_concurrency)

    async def start(index: int) -> None:
        async with gate:
            started.append(await _start_one(launch, index, shared))

    try:
        await asyncio.gather(*(start(launch.first + i) for i in range(launch.count)))
        print(f"ready {len(started)}", flush=True)
        await stop.wait()
    finally:
        for worker, own in started:
            with contextlib.suppress(Exception):
                await worker.close()
            if own is not None:
                with contextlib.suppress(Exception):
                    await own.close()
        if shared is not None:
            await shared.close()


def main() -> None:
    logging.basicConfig(level=logging.ERROR, format="fleet %(levelname)s %(name)s: %(message)s")
    launch = msgspec.json.decode(sys.stdin.buffer.read(), type=FleetLaunch)
    asyncio.run(run_fleet(launch))


if __name__ == "__main__":
    main()
