"""``interlock worker``: one engine worker that joins a deployment over NATS.

    interlock worker --model smollm2 --role both --nats-url nats://HOST:4222

Loads the engine, registers in discovery, serves generate, publishes KV events and load,
and on SIGTERM (or SIGINT) unregisters, finishes in-flight requests within the grace period and
exits. Its spec is derived exactly as ``interlock serve`` derives each of its workers'
(``interlock.cluster.spec``), and it runs as they do (``cluster.worker.run_worker``). Every flag
can also be set as INTERLOCK_<FLAG>.
"""

from __future__ import annotations

import argparse
import asyncio
import uuid
from dataclasses import replace

import msgspec

from interlock.cli import flags
from interlock.cli.security import add_security_args, cluster_secret, nats_auth
from interlock.cli.serving import (
    add_engine_args,
    add_plane_args,
    add_process_args,
    cluster_spec,
    deployment_from_args,
    process_options,
)
from interlock.cluster.runner import run_command
from interlock.cluster.spec import ClusterSpec, resolve_groups, worker_specs
from interlock.cluster.worker import WorkerLaunch, files_only, run_worker
from interlock.deploy import NodeGroup
from interlock.env import get_env
from interlock.errors import ConfigError
from interlock.names import ROLES
from interlock.protocol import subjects


def build_parser() -> argparse.ArgumentParser:
    p = flags.parser("interlock worker", __doc__)
    add_engine_args(p)
    p.add_argument("--role", choices=ROLES, default="both", help="what this worker does")
    p.add_argument("--instance-id", default=None, help="name in discovery (default: random)")
    p.add_argument("--advertise-host", default=None, help="host other machines reach this worker at")
    p.add_argument(
        "--host",
        dest="bind_host",
        default="127.0.0.1",
        help="interface the request plane and the KV transfer agent bind to",
    )
    p.add_argument("--kv-transfer-port", type=int, default=0, help="TCP port of the transfer agent (0: any)")
    p.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="port of this worker's own /metrics (0: any free one; announced in discovery)",
    )
    flags.add_log_level_arg(p)
    flags.add_tracing_arg(p)
    add_plane_args(p, nats_default=get_env().nats_url)
    add_process_args(p)
    add_security_args(p)
    return flags.apply_environment(p)


def spec_from_args(a: argparse.Namespace) -> ClusterSpec:
    """A deployment of this one worker, with no router and no HTTP frontend."""
    d = deployment_from_args(a, nodes=(NodeGroup(node_role=a.role, gpu_count=1),))
    if not d.control_plane.nats_url:
        raise ConfigError("--nats-url is required (or set INTERLOCK_NATS_URL)")
    processes = process_options(
        a,
        host=a.bind_host,
        advertise_host=a.advertise_host,
        kv_transfer_port=a.kv_transfer_port,
        metrics_port=a.metrics_port,
    )
    return cluster_spec(a, d, frontend=None, processes=processes, router=False)


def launch_from_args(a: argparse.Namespace) -> WorkerLaunch:
    spec = spec_from_args(a)
    cp = spec.deployment.control_plane
    assert cp.nats_url  # spec_from_args refuses a deployment without one
    (ws,) = worker_specs(spec, resolve_groups(spec.deployment))
    ws = replace(ws, instance_id=a.instance_id or uuid.uuid4().hex[:12])
    return WorkerLaunch(ws, cp.nats_url, cp.heartbeat_interval, cp.lease_timeout, files_only(spec.nats_auth))


async def _run(a: argparse.Namespace) -> int:
    launch = await asyncio.to_thread(launch_from_args, a)
    return await run_worker(launch, cluster_secret=cluster_secret(a), auth=nats_auth(a))


def build_control_parser() -> argparse.ArgumentParser:
    from interlock.protocol.control import OPS

    p = flags.parser("interlock worker control", "Send a control call to a running worker.")
    p.add_argument("op", choices=OPS)
    p.add_argument("--instance-id", required=True)
    p.add_argument("--nats-url", default=get_env().nats_url, help="NATS server (required)")
    p.add_argument("--role", default="", help="set_role: prefill, decode or both")
    p.add_argument("--peer", default="", help="measure_link: the peer's transfer agent HOST:PORT")
    p.add_argument("--grace", type=float, default=30.0, help="set_role: seconds to finish in-flight work")
    flags.add_log_level_arg(p)
    add_security_args(p)
    return flags.apply_environment(p)


async def _control(a: argparse.Namespace) -> int:
    """``interlock worker control set_role --role decode --instance-id w1``: one reply as JSON."""
    import json

    from interlock.protocol.control import ControlRequest
    from interlock.router.worker_control import control_call
    from interlock.runtime import RuntimeConfig, connect_runtime

    if not a.nats_url:
        raise ConfigError("--nats-url is required (or set INTERLOCK_NATS_URL)")
    runtime = await connect_runtime(
        a.nats_url,
        RuntimeConfig(cluster_secret=cluster_secret(a), nats_auth=nats_auth(a)),
        name="interlock-worker-control",
    )
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
    return run_command(
        "interlock worker", _run(a), log_level=a.log_level, log_format=a.log_format, tracing_on=a.tracing
    )
