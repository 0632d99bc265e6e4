"""The one builder: a ``ClusterSpec`` in, running components out.

    running = await start_cluster(spec)      # planes, router + frontend, workers
    await running.wait_ready()
    handle = await running.add_worker("decode")
    await running.remove_worker(handle, drain=True)
    await running.close()

Every entry point uses it: ``interlock serve`` (everything), ``interlock frontend`` (router and
frontend on an existing deployment), ``interlock worker`` (one worker here), the Python API
(``interlock.Cluster``) and the tests; so routing, disaggregation, health, queue and priority
settings apply the same whichever of them starts a router.

Planes: in-process (``ProcessOptions.in_process``), the deployment's ``nats_url``, or a private
nats-server started here (loopback, generated login, generated cluster secret), restarted on
the same port by the supervisor when it dies. Workers: child processes (each gets its
``WorkerLaunch`` on stdin and its secrets in its environment, and is restarted per
``restart_policy``), or in this process with in-process planes and for ``interlock worker``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import sys
from dataclasses import dataclass, replace
from typing import Any

from interlock.cluster import logs
from interlock.cluster.frontends import FrontendLaunch, PeersView, peer_sockets, traffic_routes
from interlock.cluster.hosts import local_host
from interlock.cluster.procs import Child, NatsProcess, python_module_argv
from interlock.cluster.secrets import child_env, new_cluster_secret
from interlock.cluster.spec import (
    ClusterSpec,
    ResolvedGroup,
    default_threads,
    device_of,
    disagg_config,
    fleet_planner_config,
    most_workers,
    process_needs,
    resolve_groups,
    router_config,
    service_options,
    worker_spec,
    worker_specs,
)
from interlock.cluster.supervisor import Supervisor, startup_failure
from interlock.cluster.worker import WorkerLaunch, WorkerSpec, files_only, start_worker
from interlock.deploy import ExecutionGroup, validate_deployment
from interlock.env import TRACING_VAR, get_env
from interlock.errors import ConfigError
from interlock.frontend.peers import PeerSet
from interlock.metrics import tracing
from interlock.names import ROLES
from interlock.planner.core import Planner
from interlock.planner.placement import GIB, Host, Needs, Placed, place, room
from interlock.planner.startup import StartupKey, StartupTimes
from interlock.runtime.config import NatsAuth, RuntimeConfig
from interlock.runtime.nats_permissions import NatsUser, worker_user

log = logging.getLogger("interlock.cluster")

STARTING_STOP_S = 3.0
"""How long a worker process that has not registered yet gets between SIGTERM and SIGKILL: it
has served nothing, so there is nothing to drain, and a vLLM worker still importing or loading
(a minute on two cores) would otherwise hold a shutdown until it had finished starting."""


@dataclass
class WorkerHandle:
    """One worker this deployment started: a child process, or a Worker in this process."""

    spec: WorkerSpec
    child: Child | None = None
    local: Any = None
    """The in-process ``engine.worker.Worker``."""

    @property
    def instance_id(self) -> str:
        return self.spec.instance_id

    @property
    def role(self) -> str:
        return self.spec.role

    @property
    def group(self) -> int:
        return self.spec.group


@dataclass(eq=False)
class RunningPlanner:
    """One planner ``RunningCluster.run_planner`` started: its loop (``status()``), the fleet
    it scales, its task, and its status server (None: not served)."""

    loop: Any
    """The ``planner.loop.PlannerLoop``."""
    fleet: Any
    """The ``cluster.fleet.ClusterFleet``."""
    task: asyncio.Task[None]
    server: asyncio.Server | None = None
    url: str | None = None

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
        await self.fleet.close()


class RunningCluster:
    """What ``start_cluster`` returns; ``close()`` stops everything it started, in order."""

    def __init__(
        self,
        spec: ClusterSpec,
        *,
        peers: PeerSet | None = None,
        expect_models: bool = False,
        on_demand: bool = False,
    ) -> None:
        """``peers``: this is one of several frontend processes on one port, not the first
        (``cluster.frontends``); ``expect_models``: list the deployment's models before their
        workers register, with ``on_demand`` as ``expect_group`` takes it (the first process's
        choice, passed on)."""
        self.spec = spec
        self.peers = peers
        self._expect_models = expect_models
        self._on_demand = on_demand
        self._frontends: list[Child] = []
        self.runtime: Any = None
        self.service: Any = None
        """The router service (the frontend's backend), or None (``interlock worker``)."""
        self.server: Any = None
        """The HTTP frontend, or None."""
        self.nats: NatsProcess | None = None
        self.url: str | None = None
        """The NATS URL the planes use (None: in-process planes)."""
        self.supervisor = Supervisor(spec.processes.restart_policy)
        self.secret = spec.cluster_secret
        self.auth = spec.nats_auth
        self._groups: list[ResolvedGroup] = []
        self._workers: dict[str, WorkerHandle] = {}
        self._next = 0
        self._prefix = f"{os.getpid():x}"
        self._catalog: Any = None
        self._logins: dict[str, NatsUser] = {}
        self.planner: Any = None
        """The ``planner.loop.PlannerLoop`` (``start_planner``), or None."""
        self.planner_url: str | None = None
        """Where its status is served (``interlock planner status --url``)."""
        self._planners: list[RunningPlanner] = []
        self.host: Host = spec.placement.host(local_host())
        """What this host offers the workers started here (``spec.placement`` over what was
        detected): no worker starts beyond it, less the headroom."""
        self._placed: dict[str, Placed] = {}
        self.startup = StartupTimes()
        """Seconds from launch to registered, per engine and model (every worker started here
        with the router in this process is timed)."""
        self._timers: set[asyncio.Task[None]] = set()

    # ---- start ----
    async def start(self) -> None:
        """Start what the spec describes; on any failure, stop what had started and re-raise."""
        try:
            await self._start()
        except BaseException:
            await self.close()
            raise

    async def _start(self) -> None:
        spec, cp = self.spec, self.spec.deployment.control_plane
        initial: list[WorkerSpec] = []
        if spec.start_workers:
            self._groups = await asyncio.to_thread(resolve_groups, spec.deployment)
            initial = worker_specs(spec, self._groups, prefix=self._prefix, cores=self._usable_cores())
            self._next = len(initial)
            placed = list(self._placed.values())
            for ws in initial:  # the fleet asked for starts; a host it oversubscribes is said
                needs = await self._needs(ws, self._groups[ws.group])
                self._place(ws.instance_id, needs, placed, strict=False)
        if not spec.processes.in_process:
            self.url = cp.nats_url
            if self.url is None:
                if not spec.start_workers or not spec.router:
                    raise ConfigError("control-plane.nats_url is required (--nats-url or INTERLOCK_NATS_URL)")
                await self._start_nats(initial)
        rt = RuntimeConfig(
            heartbeat_interval=cp.heartbeat_interval,
            lease_timeout=cp.lease_timeout,
            host=spec.processes.host,
            advertise_host=spec.processes.advertise_host,
            cluster_secret=self.secret,
            nats_auth=self.auth,
        )
        from interlock.runtime import connect_runtime

        role = "frontend" if spec.frontend is not None else "router" if spec.router else "launcher"
        self.runtime = await connect_runtime(self.url, rt, name=f"interlock-{role}")
        if spec.router:
            await self._start_router()
            pc = fleet_planner_config(spec) if spec.planner is not None else None
            on_demand = pc is not None and pc.min_workers == 0 and all(pc.bounds(r).min == 0 for r in ROLES)
            if self._expect_models and not self._groups:
                self._groups = await asyncio.to_thread(resolve_groups, spec.deployment)
                on_demand = self._on_demand
            for rg in self._groups:
                self.expect_group(rg.index, on_demand=on_demand)
        for ws in initial:
            await self._launch(ws)
        if spec.frontend is not None and self.service is not None:
            from interlock.frontend.app import serve_frontend

            fe = spec.frontend
            r, m = spec.deployment.routing, spec.deployment.metrics
            if r.route_key:
                fe = replace(fe, route_key_header=r.route_key)
            fe = replace(fe, metric_families=m.families)
            if cp.frontend_workers > 1 and self.peers is None:
                self.peers = PeerSet(0, peer_sockets(cp.frontend_workers))
            routes = traffic_routes(self.service) if self.peers is not None else ()
            self.server = await serve_frontend(
                self.service, cp.listen_host, cp.listen_port, config=fe, peers=self.peers, peer_routes=routes
            )
            if self.peers is not None and self.peers.primary:
                await self._start_frontends(on_demand)

    async def _start_frontends(self, on_demand: bool) -> None:
        """The other frontend processes on this port (``cluster.frontends``): children with the
        same routing, no workers and no planner, supervised like workers."""
        assert self.peers is not None and self.url is not None and self.server is not None
        spec, cp = self.spec, self.spec.deployment.control_plane
        child_cp = replace(cp, listen_port=self.server.port, nats_url=None)
        child_spec = replace(
            spec,
            deployment=replace(spec.deployment, control_plane=child_cp),
            start_workers=False,
            planner=None,
            cluster_secret=None,
            nats_auth=NatsAuth(),
        )
        for i in self.peers.others():
            launch = FrontendLaunch(
                child_spec,
                self.url,
                PeerSet(i, self.peers.sockets),
                files_only(self.auth),
                expect_groups=bool(self._groups),
                on_demand=on_demand,
            )
            child = Child(
                f"frontend-{i}",
                python_module_argv("interlock.cluster.frontend_main", str(i)),
                env={
                    **worker_env(),  # tracing and the log format as here
                    "INTERLOCK_LOG_LEVEL": logging.getLevelName(logging.getLogger().getEffectiveLevel()),
                    **child_env(self.secret, self.auth),
                },
                stdin_data=launch.encode(),
                relay=False,
            )
            await child.start()
            self.supervisor.watch(child)
            self._frontends.append(child)
        log.info("%d more frontend processes on port %d", len(self._frontends), self.server.port)

    async def _start_nats(self, initial: list[WorkerSpec]) -> None:
        from interlock.runtime import generate_auth

        auth = self.auth
        given = auth.password is not None or auth.token is not None  # to reach it from outside too
        self.auth = replace(auth, tls_ca=None, tls_cert=None, tls_key=None) if given else generate_auth()
        self.secret = self.secret or new_cluster_secret()
        if self.auth.user is not None:  # one confined login per worker (a token server has one login)
            self._logins = {ws.instance_id: _worker_login(ws) for ws in initial}
        self.nats = NatsProcess(auth=self.auth, users=tuple(self._logins.values()))
        await self.nats.start()
        self.supervisor.watch(self.nats)
        self.url = self.nats.url
        log.info("started nats-server at %s", self.url)

    async def _login(self, ws: WorkerSpec) -> NatsAuth:
        """A child worker's NATS login: its own confined one on our private nats-server (added
        to the running server for a worker started later), else the deployment's."""
        if self.nats is None or self.auth.user is None:
            return self.auth
        user = self._logins.get(ws.instance_id)
        if user is None:
            user = self._logins[ws.instance_id] = _worker_login(ws)
            await self.nats.add_users((user,))
        return user.auth

    async def _start_router(self) -> None:
        from interlock.protocol import subjects
        from interlock.router.service import RouterService

        rt = self.runtime
        # The first look fills discovery's table (over NATS: it subscribes, asks who is alive
        # and waits for the answers), so the router starts from every live worker.
        await rt.discovery.instances(subjects.GENERATE_ENDPOINT)
        self.service = RouterService(
            discovery=rt.discovery,
            requests=rt.requests,
            events=rt.events,
            config=router_config(self.spec),
            options=service_options(self.spec),
            disagg=disagg_config(self.spec),
            link=rt.link,
        )
        await self.service.start()
        self.service.degraded_sources.append(self.supervisor.problems)  # crash loops, a down nats-server
        self.service.metrics_registry.collect(
            "interlock_worker_restarts_total", self.supervisor.restart_samples
        )

    def expect_group(self, index: int, *, on_demand: bool) -> None:
        """Tell the router the model of execution group ``index`` is served before any of its
        workers registers: listed (503 + Retry-After, not 404, while it has none); with
        ``on_demand`` (a planner whose minimum is 0 starts its workers) its requests wait for a
        worker instead (``RouterService.expect_model``)."""
        from interlock.protocol.routing import ModelEntry

        if self.service is None or not 0 <= index < len(self._groups):
            return
        rg = self._groups[index]
        self.service.expect_model(
            ModelEntry(rg.served_name, rg.model_path, rg.max_model_len), on_demand=on_demand
        )

    async def launch(self, ws: WorkerSpec, *, core: Any = None) -> WorkerHandle:
        """Start a worker from a whole spec (``add_worker`` derives one from the deployment):
        a child process, or in this process with in-process planes or a ``core`` given."""
        return await self._launch(ws, core=core)

    async def _launch(self, ws: WorkerSpec, *, core: Any = None) -> WorkerHandle:
        started = asyncio.get_running_loop().time()
        if self.spec.processes.in_process or core is not None:
            if ws.colocated:
                raise ConfigError(
                    "colocate: models sharing a worker run in worker processes (not in-process planes)"
                )
            if ws.engine.model.engine == "interlock" and ws.engine.model.ranks > 1:
                raise ConfigError(
                    "tensor_parallel_size/pipeline_parallel_size: a worker of several ranks runs in "
                    "a worker process (a lost rank ends it), not with in-process planes"
                )
            handle = WorkerHandle(ws, local=await start_worker(ws, self.runtime, core=core))
        else:
            assert self.url is not None
            cp = self.spec.deployment.control_plane
            launch = WorkerLaunch(
                ws, self.url, cp.heartbeat_interval, cp.lease_timeout, files_only(self.auth)
            )
            login = await self._login(ws)
            child = Child(
                f"worker-{ws.instance_id.split('-', 1)[0][1:]}",
                python_module_argv("interlock.cluster.worker_main", ws.instance_id),
                env={**worker_env(), **child_env(self.secret, login)},
                stdin_data=launch.encode(),
            )
            await child.start()
            self.supervisor.watch(child)
            handle = WorkerHandle(ws, child=child)
        self._workers[ws.instance_id] = handle
        if self.service is not None:
            task = asyncio.create_task(self._time_start(handle, started), name=f"start-{ws.instance_id}")
            self._timers.add(task)
            task.add_done_callback(self._timers.discard)
        return handle

    async def _time_start(self, handle: WorkerHandle, started: float) -> None:
        """Record how long ``handle`` took from launch to registered with the router."""
        loop = asyncio.get_running_loop()
        while handle.instance_id in self._workers:
            if self.service.instance(handle.instance_id) is not None:
                self.startup.record(startup_key(handle.spec), loop.time() - started)
                return
            await self.service.wait_for_workers(self.service.num_workers() + 1, 0.5)

    # ---- placement: what this host can still take ----
    def _usable_cores(self) -> float:
        return self.host.cores - self.spec.placement.headroom_cores

    async def _needs(self, ws: WorkerSpec, rg: ResolvedGroup) -> Needs:
        """What ``ws`` takes (``spec.process_needs``; it reads a few small files)."""
        return await asyncio.to_thread(process_needs, ws, rg)

    def _place(self, instance_id: str, needs: Needs, placed: list[Placed], *, strict: bool = True) -> None:
        """Place one worker on this host (``placed``: those placed so far, appended to);
        refused, naming the resource, when it does not fit. ``strict=False`` (the fleet the
        deployment asks for at start): placed anyway with a warning, so an explicit
        ``--workers 3`` on a 2-core laptop still runs as asked (and the planner, seeing no
        room, adds nothing more)."""
        headroom = self.spec.placement.headroom
        host = place([self.host], placed, needs, headroom)
        if host is None:
            _, why = room([self.host], placed, needs, headroom)
            msg = (
                f"no room for worker {instance_id} ({_describe(needs)}): {why} "
                "(placement: in the deployment file, or serve --host-cores / --headroom-cores)"
            )
            if strict:
                raise ConfigError(msg)
            log.warning("%s: starting it anyway, as the deployment asks; the host is oversubscribed", msg)
            host = self.host
        placed.append(Placed(host.name, needs))
        self._placed[instance_id] = placed[-1]

    def _threads(self, rg: ResolvedGroup) -> int:
        """A new CPU worker's threads: the group's, else its share of the host's cores
        (``spec.default_threads``) but never more than the cores still free, so an add either
        fits or is refused, never squeezed onto busy cores."""
        if rg.group.threads:
            return rg.group.threads
        have = sum(1 for w in self._workers.values() if w.group == rg.index)
        share = default_threads(self._usable_cores(), max(have + 1, most_workers(self.spec, rg.group)))
        free = int(self._usable_cores() - sum(p.needs.cores for p in self._placed.values()) + 1e-9)
        return max(1, min(share, free))

    async def room(self, group: int = 0, role: str | None = None) -> tuple[int, str]:
        """How many more workers of ``group`` (shaped as ``add_worker`` would start one of
        ``role``; None: its first node group's) this host can take, and the resource that binds
        (``planner.placement.room``)."""
        if not self._groups:
            self._groups = await asyncio.to_thread(resolve_groups, self.spec.deployment)
        if role is None and 0 <= group < len(self._groups):
            role = self._groups[group].group.nodes[0].node_role
        rg, ws = await self._next_spec(role or "both", group, self._next)
        needs = await self._needs(ws, rg)
        return room([self.host], list(self._placed.values()), needs, self.spec.placement.headroom)

    def startup_s(self, group: int = 0) -> float:
        """Measured seconds from launch to serving of ``group``'s workers (0: none yet)."""
        if not 0 <= group < len(self._groups):
            return 0.0
        return self.startup.estimate(group_startup_key(self._groups[group]))

    # ---- workers: what the planner scales with ----
    def workers(self) -> list[WorkerHandle]:
        return list(self._workers.values())

    async def add_group(self, group: ExecutionGroup) -> int:
        """One more execution group (a model to serve, ``Cluster.register_model``), with no
        worker yet; its index for ``add_worker``."""
        validate_deployment(replace(self.spec.deployment, execution_groups=(group,)))
        if not self._groups:
            self._groups = await asyncio.to_thread(resolve_groups, self.spec.deployment)
        d = self.spec.deployment
        # Resolved first: a group refused here (a cut its model does not allow) leaves no trace.
        (rg,) = await asyncio.to_thread(resolve_groups, replace(d, execution_groups=(group,)))
        self.spec = replace(self.spec, deployment=replace(d, execution_groups=(*d.execution_groups, group)))
        n = len(self._groups)
        self._groups.append(replace(rg, index=n, colocated=tuple(replace(c, index=n) for c in rg.colocated)))
        return len(self._groups) - 1

    @property
    def tokenizers(self) -> Any:
        """The router's models' tokenizers, loaded once (``frontend.catalog.ModelCatalog``)."""
        if self._catalog is None:
            from interlock.frontend.catalog import ModelCatalog

            self._catalog = ModelCatalog(self.service)
        return self._catalog

    async def add_worker(self, role: str = "both", group: int = 0, *, core: Any = None) -> WorkerHandle:
        """Start one more worker of execution group ``group`` with ``role``, shaped like the
        group's first node group of that role (else its first node group). Refused beyond the
        group's ``max_replicas`` and when this host has no room for it (``room``: cores,
        devices or memory, less the headroom). ``core``: an engine built by the caller
        (tests), run here. It returns once the worker is launched; it serves once registered
        (``wait_serving``)."""
        if role not in ROLES:
            raise ConfigError(f"role: {role!r} is not one of {', '.join(ROLES)}")
        rg, ws = await self._next_spec(role, group, self._next)
        cap = rg.group.max_replicas
        have = sum(1 for w in self._workers.values() if w.group == group)
        if cap is not None and have >= cap:
            raise ConfigError(f"execution group {group} already has max_replicas={cap} workers")
        self._place(ws.instance_id, await self._needs(ws, rg), list(self._placed.values()))
        self._next += 1
        try:
            return await self._launch(ws, core=core)
        except BaseException:
            self._placed.pop(ws.instance_id, None)
            raise

    async def _next_spec(self, role: str, group: int, index: int) -> tuple[ResolvedGroup, WorkerSpec]:
        """The spec ``add_worker`` would start as worker ``index`` of ``group`` with ``role``."""
        if not self._groups:
            self._groups = await asyncio.to_thread(resolve_groups, self.spec.deployment)
        if not 0 <= group < len(self._groups):
            raise ConfigError(f"group: no execution group {group} (there are {len(self._groups)})")
        rg = self._groups[group]
        node = next(
            (n for n in rg.group.nodes if n.node_role == role), replace(rg.group.nodes[0], node_role=role)
        )
        ws = worker_spec(
            self.spec,
            rg,
            node,
            instance_id=f"w{index}-{self._prefix}",
            device=device_of(
                rg.group.device,
                self._free_device(rg.group.tensor_parallel_size * rg.group.pipeline_parallel_size),
            ),
            threads=self._threads(rg),
        )
        return rg, ws

    def _free_device(self, ranks: int = 1) -> int:
        """The lowest CUDA device index from which ``ranks`` devices are held by no running
        worker here (``cuda`` spreads workers over the devices, a worker of several ranks
        taking one a rank; a removed worker's devices are taken again)."""
        held: set[int] = set()
        for w in self._workers.values():
            first = w.spec.engine.model.device.partition(":")[2]
            if first.isdigit():
                held.update(range(int(first), int(first) + w.spec.engine.model.ranks))
        return next(i for i in range(len(held) + 1) if held.isdisjoint(range(i, i + ranks)))

    async def set_role(self, handle: WorkerHandle, role: str, *, grace_s: float = 30.0) -> None:
        """Re-role a running worker (control call ``set_role``: it leaves discovery, finishes
        what it has in flight within ``grace_s``, and joins again as ``role``). A child that is
        restarted later comes back with the new role."""
        if role not in ROLES:
            raise ConfigError(f"role: {role!r} is not one of {', '.join(ROLES)}")
        if handle.local is not None:
            await handle.local.set_role(role, grace_s=grace_s)
        else:
            from interlock.protocol.control import ControlRequest
            from interlock.router.worker_control import control_call

            info = self.service.instance(handle.instance_id) if self.service is not None else None
            if info is None or "control_address" not in info.metadata:
                raise ConfigError(
                    f"worker {handle.instance_id!r} is not registered (yet): cannot change its role"
                )
            reply = await control_call(
                self.runtime.requests,
                info.metadata["control_address"],
                ControlRequest(op="set_role", role=role, grace_s=grace_s),
            )
            if not reply.ok:
                raise ConfigError(f"worker {handle.instance_id!r} refused role {role!r}: {reply.error}")
        handle.spec = replace(handle.spec, role=role)
        if handle.child is not None and handle.child.stdin_data is not None:
            launch = WorkerLaunch.decode(handle.child.stdin_data)
            handle.child.stdin_data = replace(launch, spec=handle.spec).encode()

    async def remove_worker(self, handle: WorkerHandle, *, drain: bool = True) -> None:
        """Stop a worker: drained (it leaves discovery, finishes in flight within the grace
        period) or at once. A child is not restarted."""
        self._workers.pop(handle.instance_id, None)
        grace = self.spec.processes.drain_grace_s
        try:
            if handle.child is not None:
                self.supervisor.forget(handle.child.name)
                await handle.child.stop(self._stop_grace(handle, grace + 5) if drain else 0.0)
            elif handle.local is not None:
                if drain:
                    await handle.local.drain(grace_s=grace)
                else:
                    await self.runtime.discovery.unregister(handle.instance_id)
                    await handle.local.close()  # its transfer agent goes with it
        finally:  # its cores are free once it has stopped, not while it drains
            self._placed.pop(handle.instance_id, None)

    # ---- the planner ----
    async def start_planner(self) -> None:
        """Start the planner the spec asks for (``spec.planner``) over this deployment's
        workers, and its status server; call it once the first workers are ready (those it
        sees ready at its first look count as warm: no routing-weight ramp for them)."""
        from interlock.cluster.spec import fleet_planner_config
        from interlock.planner.build import build_planner

        assert self.spec.planner is not None and self.planner is None
        planner = await asyncio.to_thread(build_planner, fleet_planner_config(self.spec))
        planned = await self.run_planner(planner, status_port=self.spec.planner_port)
        self.planner, self.planner_url = planned.loop, planned.url

    async def run_planner(
        self,
        planner: Planner,
        group: int = 0,
        *,
        model: str | None = None,
        status_port: int | None = None,
    ) -> RunningPlanner:
        """Run ``planner`` (``planner.build.build_planner`` of a checked config) over the workers
        of execution group ``group``, until ``stop_planner`` or ``close``. ``model``: the router's view is
        that model's (its queue, traffic and routing weights; None: every model's).
        ``status_port``: also serve its status (``GET /planner``) there (0: any free port).
        Call it once the group's first workers are ready (see ``start_planner``)."""
        from interlock.cluster.fleet import ClusterFleet
        from interlock.planner.live import RouterServiceView
        from interlock.planner.loop import PlannerLoop
        from interlock.planner.sla import SlaPolicy
        from interlock.planner.status import serve_status

        assert self.service is not None, "a planner needs the router here"
        if isinstance(planner.policy, SlaPolicy) and 0 <= group < len(self._groups):
            self.startup.seed(group_startup_key(self._groups[group]), planner.policy.profile.startup_s)
        fleet = ClusterFleet(self, group, role_grace_s=self.spec.processes.drain_grace_s)
        view: Any = RouterServiceView(self.service, model=model)
        if (
            self.server is not None and self.server.peers is not None
        ):  # the other frontend processes' traffic too
            view = PeersView(view, self.server.peers)
        loop = PlannerLoop(planner, fleet, view)
        server, url = None, None
        if status_port is not None:
            host = self.spec.deployment.control_plane.listen_host
            try:
                server = await serve_status(loop, host, status_port)
            except OSError as e:
                raise ConfigError(
                    f"planner status: cannot listen on {host}:{status_port} "
                    f"({e.strerror or e}; --planner-port)"
                ) from None
            port = server.sockets[0].getsockname()[1]
            url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}"
        task = asyncio.create_task(loop.run(), name=f"planner-{group}")
        planned = RunningPlanner(loop, fleet, task, server, url)
        self._planners.append(planned)
        log.info(
            "planner (%s) started over group %d%s",
            planner.config.policy,
            group,
            f"; status at {url}/planner" if url else "",
        )
        return planned

    async def stop_planner(self, planned: RunningPlanner) -> None:
        """Stop a planner ``run_planner`` started (its task, its status server, the drains it
        had under way); a second call does nothing."""
        if planned in self._planners:
            self._planners.remove(planned)
            await planned.stop()

    # ---- readiness ----
    async def wait_ready(
        self,
        count: int | None = None,
        stop: asyncio.Event | None = None,
        timeout_s: float | None = None,
        progress: bool = False,
    ) -> str | None:
        """Wait until ``count`` workers (default: those started here, each model a process
        hosts counted) are registered; None when they are, else why not (timeout, stop, or a
        start-up failure that restarting will not fix, ``supervisor.startup_failure``)."""
        assert self.service is not None, "no router here to see workers register"
        count = sum(len(w.spec.instance_ids) for w in self._workers.values()) if count is None else count
        timeout_s = self.spec.processes.ready_timeout_s if timeout_s is None else timeout_s
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        children = [w.child for w in self._workers.values() if w.child is not None]
        seen = -1
        while True:
            have = self.service.num_workers()  # once per join while a fleet starts: no sort
            if progress and have != seen:
                print(f"waiting for workers: {have}/{count} ready", file=sys.stderr, flush=True)
            seen = have
            if have >= count:
                return None
            why = startup_failure(
                {c.name: self.supervisor.history(c.name) for c in children}, self.supervisor.policy
            )
            if why is not None:
                return why
            if stop is not None and stop.is_set():
                return "stopped"
            if loop.time() > deadline:
                return f"workers not ready after {timeout_s:.0f}s"
            await self.service.wait_for_workers(have + 1, 0.5)

    async def wait_serving(self, handles: list[WorkerHandle], timeout_s: float) -> str | None:
        """Wait until each of ``handles`` is registered with the router (serving); None when
        they are, else why not, naming the first worker that did not come up (the timeout, a
        start-up failure that restarting will not fix, or its removal meanwhile)."""
        assert self.service is not None, "no router here to see workers register"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            waiting = [
                h for h in handles if any(self.service.instance(i) is None for i in h.spec.instance_ids)
            ]
            if not waiting:
                return None
            first = waiting[0].instance_id
            gone = next((h.instance_id for h in waiting if h.instance_id not in self._workers), None)
            if gone is not None:
                return f"worker {gone} was removed before it served"
            children = [h.child for h in waiting if h.child is not None]
            why = startup_failure(
                {c.name: self.supervisor.history(c.name) for c in children}, self.supervisor.policy
            )
            if why is not None:
                return f"worker {first}: {why}"
            left = deadline - loop.time()
            if left <= 0:
                return f"worker {first} did not serve within {timeout_s:g}s"
            await self.service.wait_for_workers(self.service.num_workers() + 1, min(0.5, left))

    async def wait_gone(self, instance_ids: list[str], timeout_s: float) -> str | None:
        """Wait until none of ``instance_ids`` is registered with the router any more; None
        when so, else the first one still there after ``timeout_s``."""
        assert self.service is not None, "no router here to see workers leave"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            left = [i for i in instance_ids if self.service.instance(i) is not None]
            if not left:
                return None
            if loop.time() > deadline:
                return f"worker {left[0]} still registered {timeout_s:g}s after it was stopped"
            await asyncio.sleep(0.05)

    # ---- stop ----
    def _stop_grace(self, handle: WorkerHandle, grace_s: float) -> float:
        """``grace_s`` for a worker the router knows; ``STARTING_STOP_S`` for one still starting."""
        service = self.service
        if service is None or all(service.instance(i) is not None for i in handle.spec.instance_ids):
            return grace_s
        return min(grace_s, STARTING_STOP_S)

    async def close(self) -> None:
        for planned in list(self._planners):  # first: nothing may start or stop workers while we do
            await self.stop_planner(planned)
        for task in list(self._timers):
            task.cancel()
        await self.supervisor.close()  # from here on, exits are ours: nothing is restarted
        frontends, self._frontends = self._frontends, []
        await asyncio.gather(*(c.stop(self.spec.processes.drain_grace_s + 5) for c in frontends))
        if self.server is not None:
            await self.server.close()
        if self.peers is not None and self.peers.primary:
            shutil.rmtree(os.path.dirname(self.peers.socket), ignore_errors=True)
        grace = self.spec.processes.drain_grace_s
        handles = list(self._workers.values())
        self._workers.clear()
        await asyncio.gather(
            *(h.child.stop(self._stop_grace(h, grace + 5)) for h in handles if h.child is not None)
        )
        for h in handles:
            if h.local is not None:
                with contextlib.suppress(Exception):
                    await h.local.drain(grace_s=min(grace, 5.0))
        if self.service is not None:
            await self.service.close()
        if self.runtime is not None:
            await self.runtime.close()
        if self.nats is not None:
            await self.nats.stop()


async def start_cluster(spec: ClusterSpec) -> RunningCluster:
    running = RunningCluster(spec)
    await running.start()
    return running


def startup_key(ws: WorkerSpec) -> StartupKey:
    m = ws.engine.model
    return StartupKey("vllm" if m.engine == "vllm" else f"interlock/{m.runner}", ws.served_name)


def group_startup_key(rg: ResolvedGroup) -> StartupKey:
    g = rg.group
    return StartupKey("vllm" if g.engine == "vllm" else f"interlock/{g.runner}", rg.served_name)


def _describe(needs: Needs) -> str:
    parts = [f"{needs.cores:g} cores"]
    if needs.devices:
        parts.append(f"{needs.devices} devices")
    if needs.memory_bytes:
        parts.append(f"{needs.memory_bytes / GIB:.1f} GiB memory")
    return "needs " + ", ".join(parts)


def worker_env() -> dict[str, str]:
    # Short OpenMP spinning: fast between a step's kernels, asleep between steps, so workers
    # sharing cores do not starve each other (see Env.gomp_spincount).
    env = {"PYTHONUNBUFFERED": "1", "GOMP_SPINCOUNT": get_env().gomp_spincount, **logs.child_env()}
    if tracing.enabled():  # serve --tracing: its workers trace too
        env[TRACING_VAR] = "1"
    if get_env().omp_wait_policy:
        env["OMP_WAIT_POLICY"] = get_env().omp_wait_policy
    return env


def _worker_login(ws: WorkerSpec) -> NatsUser:
    """A worker process's NATS login: its own subjects and those of the models it hosts."""
    return worker_user(ws.instance_id, also=ws.instance_ids[1:])
