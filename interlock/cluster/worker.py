"""One engine worker: its typed spec, and the one way to run it (in this process, or as the
child process a local deployment starts).

A child gets its ``WorkerLaunch`` as JSON on stdin (``python -m interlock.cluster.worker_main``)
and its secrets in its environment (``cluster.secrets``): the frozen spec crosses the process
boundary as data, never as argv to be parsed again.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass

import msgspec

from interlock.engine.config import EngineConfig
from interlock.protocol import InstanceInfo, subjects
from interlock.runtime.config import NatsAuth, RuntimeConfig

log = logging.getLogger("interlock.worker")


@dataclass(frozen=True)
class WorkerSpec:
    """Everything needed to start one worker."""

    engine: EngineConfig
    served_name: str
    model_path: str
    role: str
    instance_id: str
    speedup: float = 1.0
    kv_transfer: str = "auto"
    """``none``: no transfer agent (this worker cannot disaggregate); else the transport its
    pulls use (``auto`` picks per peer; ``tcp`` also never stages in /dev/shm)."""
    kv_transfer_port: int = 0
    kv_transfer_timeout_s: float = 30.0
    host: str = "127.0.0.1"
    advertise_host: str | None = None
    metrics_port: int = 0
    """Its own ``/metrics`` port (0: any free one), announced in discovery."""
    queue_depth_threshold: int = 0
    """Registered in ``InstanceInfo``: routers count the worker busy past this queue (0: never)."""
    export_interval_s: float = 1.0
    """Load reports leave at least this often (``metrics.export_interval``)."""
    drain_grace_s: float = 30.0
    group: int = 0
    """Index of the deployment's execution group it belongs to (``Cluster.add_worker``)."""
    colocated: tuple[WorkerSpec, ...] = ()
    """More models this worker's process hosts, each a worker of its own (its own engine and
    instance id) on the same planes (``ExecutionGroup.colocate``)."""

    @property
    def instance_ids(self) -> tuple[str, ...]:
        """This worker's id and its colocated models' ids."""
        return (self.instance_id, *(c.instance_id for c in self.colocated))


@dataclass(frozen=True)
class WorkerLaunch:
    """What a worker process needs besides its secrets: the spec and how to reach the planes.
    ``files`` names credential/TLS files only; logins and the cluster secret come from the
    environment (``cluster.secrets.child_env``)."""

    spec: WorkerSpec
    nats_url: str
    heartbeat_interval: float = 1.0
    heartbeat_timeout: float = 5.0
    files: NatsAuth = NatsAuth()

    def encode(self) -> bytes:
        return msgspec.json.encode(self)

    @staticmethod
    def decode(data: bytes) -> WorkerLaunch:
        return msgspec.json.decode(data, type=WorkerLaunch)


def files_only(auth: NatsAuth) -> NatsAuth:
    return NatsAuth(
        creds_file=auth.creds_file, tls_ca=auth.tls_ca, tls_cert=auth.tls_cert, tls_key=auth.tls_key
    )


def worker_info(
    spec: WorkerSpec, *, block_size: int, kv_blocks_total: int, context_length: int | None = None
) -> InstanceInfo:
    """What the worker registers in discovery (the engine gives its block figures)."""
    return InstanceInfo(
        instance_id=spec.instance_id,
        endpoint=subjects.GENERATE_ENDPOINT,
        model=spec.served_name,
        model_path=spec.model_path,
        role=spec.role,
        block_size=block_size,
        kv_blocks_total=kv_blocks_total,
        context_length=context_length or spec.engine.scheduler.max_model_len,
        queue_depth_threshold=spec.queue_depth_threshold,
    )


def transfer_agent(spec: WorkerSpec, cluster_secret: bytes | None = None):  # type: ignore[no-untyped-def]
    """The worker's KV-transfer agent, or None (``kv_transfer`` none)."""
    if spec.kv_transfer == "none" or spec.engine.model.engine != "interlock":
        return None  # a guest engine brings its own KV connector
    from interlock.transfer import TransferAgent

    return TransferAgent(
        host=spec.host,
        port=spec.kv_transfer_port,
        advertise_host=spec.advertise_host,
        use_shm=spec.kv_transfer != "tcp",
        cluster_secret=cluster_secret,
        transport=None if spec.kv_transfer == "auto" else spec.kv_transfer,
    )


async def build_serving_engine(spec: WorkerSpec):  # type: ignore[no-untyped-def]
    """The engine behind the worker's seam: Interlock's (an ``EngineCore``, run by the worker's
    ``AsyncEngine``) or vLLM's (``engine.vllm``, started here: tens of seconds)."""
    if spec.engine.model.engine == "vllm":
        from interlock.engine.vllm import Handoff, VllmEngine

        handoff = None
        if spec.role != "both" and spec.kv_transfer != "none":
            handoff = Handoff(
                host=spec.advertise_host or spec.host,
                lease_s=spec.kv_transfer_timeout_s,
                transport=spec.kv_transfer,
            )
        return await VllmEngine.create(spec.engine, instance_id=spec.instance_id, handoff=handoff)
    from interlock.engine.factory import build_engine

    return await asyncio.to_thread(
        build_engine,
        spec.engine,
        instance_id=spec.instance_id,
        speedup=spec.speedup,
        kv_hold_timeout_s=spec.kv_transfer_timeout_s,
    )


async def start_worker(spec: WorkerSpec, runtime, *, core=None):  # type: ignore[no-untyped-def]
    """Build the engine (or take ``core``: an ``EngineCore`` or any ``ServingEngine``, tests)
    and a Worker on ``runtime``; the started Worker."""
    from interlock.engine.async_engine import AsyncEngine
    from interlock.engine.core import EngineCore
    from interlock.engine.worker import Worker, WorkerOptions

    if core is None:
        core = await build_serving_engine(spec)
    engine = AsyncEngine(core) if isinstance(core, EngineCore) else core
    info = worker_info(
        spec,
        block_size=engine.block_size,
        kv_blocks_total=engine.kv_blocks_total,
        context_length=engine.context_length,
    )
    options = WorkerOptions(
        drain_grace_s=spec.drain_grace_s,
        kv_transfer_timeout_s=spec.kv_transfer_timeout_s,
        idle_report_s=spec.export_interval_s,
        metrics_port=spec.metrics_port,
        metrics_host=spec.advertise_host,
    )
    worker = Worker(
        engine,
        info,
        discovery=runtime.discovery,
        requests=runtime.requests,
        events=runtime.events,
        options=options,
        transfer=transfer_agent(spec, runtime.config.cluster_secret),
    )
    await worker.start()
    return worker


async def run_worker(launch: WorkerLaunch, *, cluster_secret: bytes | None, auth: NatsAuth) -> int:
    """Join the deployment, serve until SIGTERM/SIGINT, then drain: ``interlock worker`` and
    every worker process a local deployment starts."""
    from interlock.runtime import connect_runtime

    spec = launch.spec
    cfg = RuntimeConfig(
        heartbeat_interval=launch.heartbeat_interval,
        lease_timeout=launch.heartbeat_timeout,
        host=spec.host,
        advertise_host=spec.advertise_host,
        cluster_secret=cluster_secret,
        nats_auth=auth,
    )
    runtime = await connect_runtime(launch.nats_url, cfg, name=f"interlock-worker-{spec.instance_id}")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        # The host model first, then the models it hosts (each its own engine and instance).
        workers = [await start_worker(s, runtime) for s in (spec, *spec.colocated)]
        for s in (spec, *spec.colocated):
            print(
                f"worker {s.instance_id} ready: model={s.served_name} role={s.role} "
                f"engine={s.engine.model.engine}",
                flush=True,
            )
        waiters = [asyncio.ensure_future(stop.wait())]
        waiters += [asyncio.ensure_future(w.dead.wait()) for w in workers]
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for waiter in waiters:
            waiter.cancel()
        dead = [(s, w) for s, w in zip((spec, *spec.colocated), workers, strict=True) if w.dead.is_set()]
        if dead:
            # An engine died under a live process: exit non-zero so a supervisor restarts us.
            for s, w in dead:
                log.error("worker %s exits: %s", s.instance_id, w.problem)
            await asyncio.gather(*(w.close() for w in workers))
            return 1
        log.info("draining (grace %.0fs)", spec.drain_grace_s)
        await asyncio.gather(*(w.drain() for w in workers))
    finally:
        await runtime.close()
    return 0
