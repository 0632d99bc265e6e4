"""``interlock frontend``: the HTTP frontend and router, joining workers over NATS.

    interlock frontend --port 8000 --nats-url nats://HOST:4222 [--policy kv] [--api-key KEY]
    interlock frontend -f cluster.yaml --nats-url nats://HOST:4222   # routing from the file

Built by the same builder as ``interlock serve`` (``interlock.cluster``): routing,
disaggregation (as soon as prefill workers join), health checks, queueing and priorities act
the same. Several frontends can run side by side on one deployment: their routers share
dispatch-time load over the event plane. Every flag can also be set as INTERLOCK_<FLAG>.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

from interlock.cli import flags
from interlock.cli.security import add_security_args
from interlock.cli.serving import (
    add_listen_args,
    add_plane_args,
    add_routing_args,
    cluster_spec,
    deployment_from_args,
)
from interlock.cluster.builder import RunningCluster
from interlock.cluster.runner import run_command
from interlock.cluster.spec import ClusterSpec, ProcessOptions
from interlock.env import get_env
from interlock.frontend.flags import add_frontend_args, frontend_config


def build_parser() -> argparse.ArgumentParser:
    p = flags.parser("interlock frontend", __doc__)
    p.add_argument(
        "-f",
        "--file",
        default=None,
        help="deployment file: its control-plane, routing and metrics sections apply "
        "(its workers are started elsewhere)",
    )
    add_listen_args(p)
    flags.add_log_level_arg(p)
    flags.add_tracing_arg(p)
    add_plane_args(p, nats_default=get_env().nats_url)
    add_routing_args(p)
    add_frontend_args(p)
    add_security_args(p)
    return flags.apply_environment(p)


def spec_from_args(a: argparse.Namespace) -> ClusterSpec:
    """The router and HTTP frontend of a deployment whose workers run elsewhere (no process
    flags: this command starts no worker)."""
    d = deployment_from_args(a)
    frontend = frontend_config(a, env_api_keys=get_env().api_keys)
    return cluster_spec(a, d, frontend=frontend, processes=ProcessOptions(), start_workers=False)


async def _run(a: argparse.Namespace) -> int:
    spec = spec_from_args(a)
    running = RunningCluster(spec)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await running.start()
        assert spec.frontend is not None and running.server is not None
        keys = f", {len(spec.frontend.auth.api_keys)} API keys" if spec.frontend.auth.api_keys else ""
        print(
            f"frontend at {running.server.url}/v1 (policy {spec.deployment.routing.policy}, "
            f"nats {running.url}{keys})",
            flush=True,
        )
        await stop.wait()
    finally:
        await running.close()
    return 0


def main(argv: list[str]) -> int:
    a = build_parser().parse_args(argv)
    return run_command(
        "interlock frontend", _run(a), log_level=a.log_level, log_format=a.log_format, tracing_on=a.tracing
    )
