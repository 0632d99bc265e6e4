"""``interlock worker``: one engine worker that joins a deployment over NATS.

    interlock worker --model smollm2 --role both --nats-url nats://HOST:4222

Loads the engine, registers in discovery, serves ``generate``, publishes KV events and load,
and on SIGTERM (or SIGINT) unregisters, finishes in-flight requests within the grace period and
exits.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import uuid
from dataclasses import dataclass

import msgspec

from interlock.cli.runner import run_command
from interlock.cli.security import add_security_args, cluster_secret, nats_auth
from interlock.engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from interlock.env import get_env
from interlock.errors import ConfigError
from interlock.protocol import InstanceInfo, subjects

log = logging.getLogger("interlock.worker")


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """Flags that fill EngineConfig (shared by ``worker`` and ``serve``)."""
    g = p.add_argument_group("engine")
    g.add_argument("--model", default="smollm2", help="model name, HF folder or GGUF file")
    g.add_argument("--served-model-name", default=None, help="name clients use (default: model's)")
    g.add_argument("--runner", choices=("torch", "mock"), default="torch")
    g.add_argument("--device", default="cpu", help="cpu or cuda")
    g.add_argument("--dtype", default="bfloat16")
    g.add_argument("--block-size", type=int, default=16)
    g.add_argument("--num-blocks", type=int, default=None, help="KV blocks (default: from --kv-cache-gib)")
    g.add_argument("--kv-cache-gib", type=float, default=1.0)
    g.add_argument("--host-kv-gib", type=float, default=0.0, help="host-memory KV tier (0: none)")
    g.add_argument("--disk-kv-gib", type=float, default=0.0, help="disk KV tier (0: none)")
    g.add_argument("--disk-kv-path", default=None, help="directory of the disk KV tier")
    g.add_argument("--host-kv-shared", default=None, metavar="NAME",
                   help="share the host KV tier with this host's workers of the same NAME")
    g.add_argument("--max-num-seqs", type=int, default=64)
    g.add_argument("--max-num-batched-tokens", type=int, default=2048)
    g.add_argument("--max-model-len", type=int, default=2048)
    g.add_argument("--no-prefix-caching", action="store_true")
    g.add_argument("--preempt-enabled", action=argparse.BooleanOptionalAction, default=None,
                   help="a more important waiting request (lower priority) may preempt a less "
                        "important running one (default: off; serve -f: routing.preempt_enabled)")
    g.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    g.add_argument("--speedup", type=float, default=1.0, help="mock runner: divide model time by this")


def engine_config_from_args(a: argparse.Namespace, model_path: str) -> EngineConfig:
    return EngineConfig(
        model=ModelConfig(model=model_path, runner=a.runner, device=a.device, dtype=a.dtype,
                          num_threads=a.threads),
        cache=CacheConfig(block_size=a.block_size, num_blocks=a.num_blocks,
                          kv_cache_gib=a.kv_cache_gib, enable_prefix_caching=not a.no_prefix_caching,
                          host_kv_gib=a.host_kv_gib, disk_kv_gib=a.disk_kv_gib,
                          disk_kv_path=a.disk_kv_path, host_kv_shared=a.host_kv_shared),
        scheduler=SchedulerConfig(max_num_batched_tokens=a.max_num_batched_tokens,
                                  max_num_seqs=a.max_num_seqs, max_model_len=a.max_model_len,
                                  preempt_enabled=bool(a.preempt_enabled)),
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="interlock worker", description=__doc__.split("\n\n")[0])
    add_engine_args(p)
    p.add_argument("--role", choices=("both", "prefill", "decode"), default="both")
    p.add_argument("--nats-url", default=get_env().nats_url, help="NATS server (required)")
    p.add_argument("--instance-id", default=None)
    p.add_argument("--heartbeat-interval", type=float, default=1.0)
    p.add_argument("--heartbeat-timeout", type=float, default=5.0)
    p.add_argument("--advertise-host", default=None, help="host other machines reach this worker at")
    p.add_argument("--host", default="127.0.0.1", help="interface the request plane binds to")
    p.add_argument("--drain-grace", type=float, default=30.0)
    p.add_argument("--kv-transfer", choices=("auto", "inproc", "shm", "tcp", "none"), default="auto",
                   help="KV transfer for disaggregated serving: auto picks per peer (in-process, "
                        "shared memory, TCP); tcp never stages in /dev/shm; none: no transfer agent")
    p.add_argument("--queue-depth-threshold", type=int, default=0,
                   help="routers count this worker busy while more requests wait in its queue (0: never)")
    p.add_argument("--kv-transfer-port", type=int, default=0, help="TCP port of the transfer agent")
    p.add_argument("--kv-transfer-timeout", type=float, default=30.0,
                   help="seconds a staged KV payload waits to be pulled (and a pull may take)")
    p.add_argument("--log-level", default=get_env().log_level)
    add_security_args(p)
    return p


@dataclass(frozen=True)
class WorkerSpec:
    """Everything needed to start one worker in this process."""

    engine: EngineConfig
    served_name: str
    model_path: str
    role: str
    instance_id: str
    speedup: float = 1.0
    kv_transfer: str = "auto"
    """``auto``/``inproc``/``shm``: a transfer agent staging in /dev/shm; ``tcp``: private
    staging (peers pull over TCP); ``none``: no agent (this worker cannot disaggregate)."""
    kv_transfer_port: int = 0
    kv_transfer_timeout_s: float = 30.0
    host: str = "127.0.0.1"
    advertise_host: str | None = None
    queue_depth_threshold: int = 0
    """Registered in ``InstanceInfo``: routers count the worker busy past this queue (0: never)."""


def resolve_spec(a: argparse.Namespace) -> WorkerSpec:
    from interlock.model_store import resolve_model, served_model_name

    path = str(resolve_model(a.model))
    return WorkerSpec(
        engine=engine_config_from_args(a, path),
        served_name=a.served_model_name or served_model_name(path),
        model_path=path,
        role=a.role,
        instance_id=a.instance_id or uuid.uuid4().hex[:12],
        speedup=a.speedup,
        kv_transfer=a.kv_transfer,
        kv_transfer_port=a.kv_transfer_port,
        kv_transfer_timeout_s=a.kv_transfer_timeout,
        host=a.host,
        advertise_host=a.advertise_host,
        queue_depth_threshold=a.queue_depth_threshold,
    )


def worker_info(spec: WorkerSpec, *, block_size: int, kv_blocks_total: int) -> InstanceInfo:
    """What the worker registers in discovery (the engine gives its block figures)."""
    return InstanceInfo(
        instance_id=spec.instance_id,
        endpoint=subjects.GENERATE_ENDPOINT,
        model=spec.served_name,
        model_path=spec.model_path,
        role=spec.role,
        block_size=block_size,
        kv_blocks_total=kv_blocks_total,
        context_length=spec.engine.scheduler.max_model_len,
        queue_depth_threshold=spec.queue_depth_threshold,
    )


def transfer_agent(spec: WorkerSpec, cluster_secret: bytes | None = None):  # type: ignore[no-untyped-def]
    """The worker's KV-transfer agent, or None (``--kv-transfer none``)."""
    if spec.kv_transfer == "none":
        return None
    from interlock.transfer import TransferAgent

    return TransferAgent(host=spec.host, port=spec.kv_transfer_port, advertise_host=spec.advertise_host,
                         use_shm=spec.kv_transfer != "tcp", cluster_secret=cluster_secret)


async def start_worker(spec: WorkerSpec, runtime, *, drain_grace_s: float = 30.0):  # type: ignore[no-untyped-def]
    """Build the engine and a Worker on ``runtime``; return the started Worker."""
    from interlock.engine.factory import build_engine
    from interlock.engine.worker import Worker, WorkerOptions

    core = await asyncio.to_thread(
        build_engine, spec.engine, instance_id=spec.instance_id, speedup=spec.speedup
    )
    info = worker_info(spec, block_size=core.block_size, kv_blocks_total=core.pool.num_blocks)
    worker = Worker(core, info, discovery=runtime.discovery, requests=runtime.requests,
                    events=runtime.events, options=WorkerOptions(drain_grace_s=drain_grace_s,
                                                              kv_transfer_timeout_s=spec.kv_transfer_timeout_s),
                    transfer=transfer_agent(spec, runtime.config.cluster_secret))
    await worker.start()
    return worker


async def _run(a: argparse.Namespace) -> int:
    from interlock.runtime import RuntimeConfig, connect_runtime

    if not a.nats_url:
        raise ConfigError("--nats-url is required (or set INTERLOCK_NATS_URL)")
    spec = resolve_spec(a)
    cfg = RuntimeConfig(heartbeat_interval=a.heartbeat_interval, lease_timeout=a.heartbeat_timeout,
                        host=a.host, advertise_host=a.advertise_host,
                        cluster_secret=cluster_secret(a), nats_auth=nats_auth(a))
    runtime = await connect_runtime(a.nats_url, cfg)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        worker = await start_worker(spec, runtime, drain_grace_s=a.drain_grace)
        print(f"worker {spec.instance_id} ready: model={spec.served_name} role={spec.role}", flush=True)
        await stop.wait()
        log.info("draining (grace %.0fs)", a.drain_grace)
        await worker.drain()
    finally:
        await runtime.close()
    return 0


def build_control_parser() -> argparse.ArgumentParser:
    from interlock.protocol.control import OPS

    p = argparse.ArgumentParser(prog="interlock worker control",
                                description="Send a control call to a running worker.")
    p.add_argument("op", choices=OPS)
    p.add_argument("--instance-id", required=True)
    p.add_argument("--nats-url", default=get_env().nats_url, help="NATS server (required)")
    p.add_argument("--role", default="", help="set_role: prefill, decode or both")
    p.add_argument("--peer", default="", help="measure_link: the peer's transfer agent HOST:PORT")
    p.add_argument("--grace", type=float, default=30.0, help="set_role: seconds to finish in-flight work")
    p.add_argument("--log-level", default=get_env().log_level)
    add_security_args(p)
    return p


async def _control(a: argparse.Namespace) -> int:
    """``interlock worker control set_role --role decode --instance-id w1``: one reply as JSON."""
    import json

    from interlock.protocol.control import ControlRequest
    from interlock.router.disagg_flow import control_call
    from interlock.runtime import RuntimeConfig, connect_runtime

    if not a.nats_url:
        raise ConfigError("--nats-url is required (or set INTERLOCK_NATS_URL)")
    runtime = await connect_runtime(a.nats_url, RuntimeConfig(cluster_secret=cluster_secret(a),
                                                              nats_auth=nats_auth(a)))
    try:
        infos = {i.instance_id: i for i in await runtime.discovery.instances(subjects.GENERATE_ENDPOINT)}
        info = infos.get(a.instance_id)
        if info is None or "control_address" not in info.metadata:
            raise ConfigError(f"no worker {a.instance_id!r} with a control endpoint (known: {sorted(infos)})")
        req = ControlRequest(op=a.op, role=a.role, peer_address=a.peer, grace_s=a.grace)
        reply = await control_call(runtime.requests, info.metadata["control_address"], req)
    finally:
        await runtime.close()
    print(json.dumps(msgspec.to_builtins(reply)))
    return 0 if reply.ok else 1


def main(argv: list[str]) -> int:
    if argv[:1] == ["control"]:
        c = build_control_parser().parse_args(argv[1:])
        return run_command("interlock worker control", _control(c), log_level=c.log_level)
    a = build_parser().parse_args(argv)
    return run_command("interlock worker", _run(a), log_level=a.log_level)
