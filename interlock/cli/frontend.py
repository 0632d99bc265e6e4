"""``interlock frontend``: the HTTP frontend and router, joining workers over NATS.

    interlock frontend --port 8000 --nats-url nats://HOST:4222 [--policy kv] [--api-key KEY]

Several frontends can run side by side on one deployment: their routers share dispatch-time
load over the event plane.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

from interlock.cli.runner import run_command
from interlock.cli.security import add_security_args, cluster_secret, nats_auth
from interlock.cli.serving import add_dispatch_args, dispatch_options, router_config
from interlock.deploy import Routing
from interlock.env import get_env
from interlock.errors import ConfigError
from interlock.frontend.flags import add_frontend_args, frontend_config


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="interlock frontend", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--nats-url", default=get_env().nats_url)
    p.add_argument("--policy", default="kv")
    p.add_argument("--route-key-header", default=None)
    p.add_argument("--heartbeat-interval", type=float, default=1.0)
    p.add_argument("--heartbeat-timeout", type=float, default=5.0)
    p.add_argument("--log-level", default=get_env().log_level)
    add_dispatch_args(p)
    add_frontend_args(p)
    add_security_args(p)
    return p


async def _run(a: argparse.Namespace) -> int:
    from interlock.frontend.app import serve_frontend
    from interlock.frontend.config import FrontendConfig
    from interlock.router.service import RouterService, ServiceOptions
    from interlock.runtime import RuntimeConfig, connect_runtime

    if not a.nats_url:
        raise ConfigError("--nats-url is required (or set INTERLOCK_NATS_URL)")
    routing = Routing(policy=a.policy, route_key=a.route_key_header)
    from interlock.deploy import Deployment, validate_deployment

    validate_deployment(Deployment(routing=routing))
    runtime = await connect_runtime(
        a.nats_url, RuntimeConfig(heartbeat_interval=a.heartbeat_interval, lease_timeout=a.heartbeat_timeout,
                                  cluster_secret=cluster_secret(a), nats_auth=nats_auth(a))
    )
    service = RouterService(discovery=runtime.discovery, requests=runtime.requests,
                            events=runtime.events, config=router_config(routing),
                            options=ServiceOptions(dispatch=dispatch_options(a)))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await service.start()
    base = FrontendConfig(route_key_header=a.route_key_header) if a.route_key_header else FrontendConfig()
    cfg = frontend_config(a, env_api_keys=get_env().api_keys, base=base)
    server = await serve_frontend(service, a.host, a.port, config=cfg)
    keys = f", {len(cfg.auth.api_keys)} API keys" if cfg.auth.api_keys else ""
    print(f"frontend at {server.url}/v1 (policy {a.policy}, nats {a.nats_url}{keys})", flush=True)
    try:
        await stop.wait()
    finally:
        await server.close()
        await service.close()
        await runtime.close()
    return 0


def main(argv: list[str]) -> int:
    a = build_parser().parse_args(argv)
    return run_command("interlock frontend", _run(a), log_level=a.log_level)
