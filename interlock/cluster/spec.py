"""What a local deployment is made of, as frozen values: the ``Deployment`` (file, flags or the
Python API) plus what only a running process has (frontend limits, dispatch options, secrets,
process handling). Pure: ``worker_specs`` and the router's settings are derived here and
nowhere else, so ``serve``, ``frontend``, ``worker``, ``Cluster`` and the tests agree.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from interlock.cluster.hosts import model_footprint
from interlock.cluster.supervisor import RestartPolicy
from interlock.cluster.worker import WorkerSpec
from interlock.deploy import (
    PLACEMENT_SECTION,
    Deployment,
    ExecutionGroup,
    NodeGroup,
    Routing,
    default_block_size,
    shared_kv_cache,
    validate_deployment,
)
from interlock.engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from interlock.errors import ConfigError
from interlock.frontend.config import FrontendConfig
from interlock.model_store import footprint
from interlock.names import ROLES
from interlock.planner.config import PlannerConfig
from interlock.planner.placement import GIB, Headroom, Host, Needs
from interlock.router.cost import CostParams
from interlock.router.disagg import DisaggConfig
from interlock.router.dispatcher import DispatchOptions
from interlock.router.model_router import RouterConfig
from interlock.router.service import ServiceOptions
from interlock.runtime.config import NatsAuth

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProcessOptions:
    in_process: bool = False
    """In-process planes and workers: no NATS, no child processes (``serve --single-process``)."""
    restart_policy: RestartPolicy = RestartPolicy.ON_FAILURE
    drain_grace_s: float = 30.0
    ready_timeout_s: float = 600.0
    host: str = "127.0.0.1"
    """Interface a worker's request plane and transfer agent bind to (``interlock worker``)."""
    advertise_host: str | None = None
    kv_transfer_port: int = 0
    kv_transfer_timeout_s: float = 30.0
    metrics_port: int = 0
    """Where a worker serves its own ``/metrics`` (0: any free port; it is announced)."""


@dataclass(frozen=True)
class PlacementConfig:
    """What this host offers its workers and what is kept free (``placement:`` section, ``serve
    --host-cores`` ... flags): workers start here only while they fit (``planner.placement``).
    A resource left None is detected (cores: this process's CPU affinity; memory: MemTotal;
    devices: the NVIDIA driver's GPUs), so a test or a shared machine can declare less."""

    cores: float | None = None
    memory_gib: float | None = None
    devices: int | None = None
    headroom_cores: float = 0.0
    """Cores no worker may take (the router, the frontend, the system)."""
    headroom_memory_gib: float = 0.0

    def __post_init__(self) -> None:
        for name in ("cores", "memory_gib", "devices", "headroom_cores", "headroom_memory_gib"):
            value = getattr(self, name)
            if value is not None and not (value >= 0 and math.isfinite(value)):
                raise ConfigError(f"placement.{name}: must be a finite number >= 0, got {value}")
        if self.cores is not None and self.cores <= self.headroom_cores:
            raise ConfigError(
                f"placement.cores: {self.cores:g} leaves nothing beside headroom_cores {self.headroom_cores:g}"
            )

    @property
    def headroom(self) -> Headroom:
        return Headroom(self.headroom_cores, int(self.headroom_memory_gib * GIB))

    def host(self, detected: Host) -> Host:
        """``detected`` with what this config declares instead."""
        return Host(
            detected.name,
            detected.cores if self.cores is None else self.cores,
            detected.devices if self.devices is None else self.devices,
            detected.memory_bytes if self.memory_gib is None else int(self.memory_gib * GIB),
        )


def parse_placement(raw: Any, where: str = PLACEMENT_SECTION) -> PlacementConfig:
    """A ``placement:`` section: its keys (``-`` or ``_``) as ``PlacementConfig``'s fields;
    an unknown key or a value of the wrong type is refused by name."""
    if raw is None:
        return PlacementConfig()
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {type(raw).__name__}")
    known = {f.name: f for f in fields(PlacementConfig)}
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        name = str(key).replace("-", "_")
        if name not in known:
            raise ConfigError(f"{where}.{key}: unknown key (known: {', '.join(sorted(known))})")
        integral = name == "devices"
        if isinstance(value, bool) or not isinstance(value, int if integral else int | float):
            raise ConfigError(
                f"{where}.{key}: expected {'an integer' if integral else 'a number'}, got {value!r}"
            )
        kwargs[name] = value
    return PlacementConfig(**kwargs)


@dataclass(frozen=True)
class ClusterSpec:
    deployment: Deployment = Deployment()
    frontend: FrontendConfig | None = FrontendConfig()
    """None: no HTTP server (the Python API talks to the router directly)."""
    router: bool = True
    """False: no router in this process (``interlock worker``)."""
    start_workers: bool = True
    """False: only the router and frontend join an existing deployment (``interlock frontend``)."""
    processes: ProcessOptions = ProcessOptions()
    cluster_secret: bytes | None = field(default=None, repr=False)
    nats_auth: NatsAuth = NatsAuth()
    planner: PlannerConfig | None = None
    """None: the fleet keeps its size. Else a planner adds, removes and re-roles the workers
    of the (one) execution group (``RunningCluster.start_planner``)."""
    planner_port: int = 8010
    """Where the planner's status (``GET /planner``, ``/metrics``) is served, on the frontend's
    interface (0: any free port)."""
    placement: PlacementConfig = PlacementConfig()
    """This host's resources and headroom: no worker starts here beyond them."""

    def __post_init__(self) -> None:
        if self.planner is not None:
            fleet_planner_config(self)  # refuses what a planner cannot run with, by name
        r = self.deployment.routing
        if (
            self.start_workers
            and (r.enforce_disagg or not r.fallback_to_local)
            and not any(n.node_role == "prefill" and n.gpu_count for n in self.deployment.nodes)
        ):
            key = "enforce_disagg" if r.enforce_disagg else "fallback_to_local: false"
            raise ConfigError(
                f"routing.{key}: needs a node group with node_role prefill (every "
                "request would fail without one)"
            )
        if self.deployment.control_plane.frontend_workers > 1 and (
            self.processes.in_process or self.frontend is None or not self.router
        ):
            raise ConfigError(
                "control-plane.frontend_workers: more than one frontend process needs the HTTP "
                "frontend and NATS planes (not --single-process, not the Python API's in-process router)"
            )
        if self.processes.in_process and self.deployment.control_plane.nats_url:
            raise ConfigError("control-plane.nats_url: not used with in-process planes (--single-process)")


def fleet_planner_config(spec: ClusterSpec) -> PlannerConfig:
    """The planner's configuration for this deployment: its bounds capped by the execution
    group's ``max_replicas`` (``add_worker`` refuses more anyway); refuses a deployment the
    planner cannot drive."""
    cfg, d = spec.planner, spec.deployment
    assert cfg is not None
    if not (spec.router and spec.start_workers):
        raise ConfigError("planner: needs the router and the workers in this process (interlock serve)")
    if len(d.execution_groups) != 1:
        raise ConfigError(
            f"planner: scales one execution group, the deployment has {len(d.execution_groups)}"
        )
    if not 0 <= spec.planner_port < 65536:
        raise ConfigError(f"--planner-port: {spec.planner_port} is not a valid port")
    started = {n.node_role for n in d.nodes if n.gpu_count}
    return group_planner_config(cfg, d.execution_groups[0], d.routing.policy, started)


def group_planner_config(
    cfg: PlannerConfig, group: ExecutionGroup, routing_policy: str, started: set[str]
) -> PlannerConfig:
    """``cfg`` for a planner that scales ``group`` (whose workers of the roles ``started`` run):
    its bounds capped by the group's ``max_replicas``; refused, by name, when the planner could
    not drive the group (``interlock serve`` and ``Cluster.create_serving_instance``)."""
    from interlock.names import UNWEIGHTED_POLICIES

    if cfg.ramp_s > 0 and routing_policy in UNWEIGHTED_POLICIES:
        raise ConfigError(
            f"routing.policy {routing_policy!r} has no routing weights: a planner ramp "
            "needs kv, least-loaded or power-of-two (or planner.ramp_s 0)"
        )
    for role in sorted(started):
        if cfg.bounds(role).max == 0:
            raise ConfigError(
                f"planner.{role}: the deployment starts {role} workers but the "
                f"planner's {role} max is 0 (give planner.{role}: {{min: N, max: M}})"
            )
    cap = group.max_replicas
    if cap is None or cap >= cfg.total_max():
        return cfg
    if cfg.min_workers > cap or sum(cfg.bounds(r).min for r in ROLES) > cap:
        raise ConfigError(f"planner: its minimum workers exceed execution-group.max_replicas={cap}")
    return replace(cfg, max_workers=cap)


def router_config(spec: ClusterSpec) -> RouterConfig:
    r = spec.deployment.routing
    return RouterConfig(
        policy=r.policy,
        queue_capacity=r.queue_size,
        cost=CostParams(
            kv_watermark=r.kv_usage_watermark,
            chunk_tokens=chunk_tokens(spec.deployment),
            stall_over=r.stall_over,
        ),
    )


def chunk_tokens(d: Deployment) -> int:
    """The workers' smallest prefill budget per step."""
    return min((n.max_num_batched_tokens for n in d.nodes), default=NodeGroup().max_num_batched_tokens)


def dispatch_options(r: Routing) -> DispatchOptions:
    return DispatchOptions(
        migration_limit=r.migration_limit, stall_floor_s=r.stall_timeout_s, queue_timeout_s=r.queue_timeout_s
    )


def service_options(spec: ClusterSpec) -> ServiceOptions:
    cp = spec.deployment.control_plane
    return ServiceOptions(
        dispatch=dispatch_options(spec.deployment.routing),
        health_check_s=cp.heartbeat_interval if cp.health_check_enabled else None,
        kv_index=spec.deployment.routing.kv_index,
        kv_shard=spec.deployment.routing.kv_shard,
    )


def disagg_config(spec: ClusterSpec) -> DisaggConfig:
    """Always on: a request takes the disaggregated path once its model has prefill workers,
    whichever command started the router (``interlock frontend`` knows no roles in advance)."""
    r = spec.deployment.routing
    return DisaggConfig(
        enforce=r.enforce_disagg or not r.fallback_to_local,
        max_kv_bytes=r.max_remote_kv_bytes,
        chunk_tokens=chunk_tokens(spec.deployment),
    )


@dataclass(frozen=True)
class ResolvedGroup:
    """An execution group with its model resolved (converted once) and context length known."""

    index: int
    group: ExecutionGroup
    model_path: str
    served_name: str
    max_model_len: int
    colocated: tuple[ResolvedGroup, ...] = ()
    """The models each worker of this group also hosts (``ExecutionGroup.colocate``)."""


def resolve_groups(d: Deployment, *, progress: bool = True) -> list[ResolvedGroup]:
    from interlock.model_store import context_length, resolve_model, served_model_name

    def resolve(i: int, g: ExecutionGroup, at: str) -> ResolvedGroup:
        path = str(resolve_model(g.model, progress=progress))
        if g.optimization_profile is not None and g.engine == "interlock":
            g = _laid_out(g, Path(path), at)
        _check_cut(g, path, at)
        return ResolvedGroup(
            i,
            g,
            path,
            g.served_model_name or served_model_name(path),
            g.max_model_len or context_length(path),
            tuple(resolve(i, c, f"{at}.colocate[{k}]") for k, c in enumerate(g.colocate)),
        )

    return [resolve(i, g, f"execution-group[{i}]") for i, g in enumerate(d.execution_groups)]


def _laid_out(g: ExecutionGroup, folder: Path, at: str) -> ExecutionGroup:
    """``g`` with the sizes its ``optimization_profile`` chooses on this host (said in the log)."""
    from interlock.cluster.layout import choose_layout

    plan = choose_layout(g, folder)
    log.info(
        "%s: %s layout TP %d x PP %d (%s)",
        at,
        g.optimization_profile,
        plan.tensor,
        plan.pipeline,
        "; ".join(plan.explanation),
    )
    laid = replace(g, tensor_parallel_size=plan.tensor, pipeline_parallel_size=plan.pipeline)
    try:  # what the sizes chosen must agree with (roles, tiers, colocation), checked again
        validate_deployment(Deployment(execution_groups=(laid,)))
    except ConfigError as e:
        raise ConfigError(
            f"{at}: {g.optimization_profile} chose TP {plan.tensor} x PP {plan.pipeline}, which the "
            f"group's other settings refuse: {e.message} (pin the sizes to keep them)"
        ) from e
    return laid


def _check_cut(g: ExecutionGroup, path: str, at: str) -> None:
    """Refuse at start a group of ranks its model cannot be cut into (not in every worker):
    by Interlock's rule, or vLLM's stricter one (heads divisible by the tensor size)."""
    if g.tensor_parallel_size * g.pipeline_parallel_size == 1:
        return
    from interlock.engine.model.config import ModelArchConfig
    from interlock.engine.model.partition import check_sizes

    config = ModelArchConfig.from_folder(Path(path))
    why = check_sizes(config, g.tensor_parallel_size, g.pipeline_parallel_size)
    t = g.tensor_parallel_size
    if not why and g.engine == "vllm" and config.num_heads % t:
        why = (
            f"vLLM needs the model's {config.num_heads} attention heads divisible by tensor_parallel_size {t}"
        )
    if why:
        raise ConfigError(f"{at}: {why}")


def worker_spec(
    spec: ClusterSpec, rg: ResolvedGroup, node: NodeGroup, *, instance_id: str, device: str, threads: int
) -> WorkerSpec:
    g, d, p = rg.group, spec.deployment, spec.processes
    engine = EngineConfig(
        model=ModelConfig(
            model=rg.model_path,
            runner=g.runner,
            device=device,
            dtype=g.dtype,
            num_threads=threads,
            engine=g.engine,
            engine_args=g.engine_args,
            tensor_parallel_size=g.tensor_parallel_size,
            pipeline_parallel_size=g.pipeline_parallel_size,
            offload_after_s=g.offload_after_s,
        ),
        cache=CacheConfig(
            block_size=g.block_size or default_block_size(g.engine, device.split(":")[0]),
            num_blocks=node.num_blocks,
            kv_cache_gib=node.kv_cache_gib,
            enable_prefix_caching=g.enable_prefix_caching,
            host_kv_gib=node.host_kv_gib,
            host_kv_shared=node.host_kv_shared,
            disk_kv_gib=node.disk_kv_gib,
            disk_kv_path=node.disk_kv_path,
            tier_load_timeout_s=node.tier_load_timeout_s,
            tier_load_min_mib_s=node.tier_load_min_mib_s,
            shared_kv_cache=shared_kv_cache(g, node),
        ),
        scheduler=SchedulerConfig(
            max_num_batched_tokens=node.max_num_batched_tokens,
            max_num_seqs=node.max_num_seqs,
            max_model_len=rg.max_model_len,
            preempt_enabled=d.routing.preempt_enabled,
        ),
    )
    return WorkerSpec(
        engine=engine,
        served_name=rg.served_name,
        model_path=rg.model_path,
        role=node.node_role,
        instance_id=instance_id,
        speedup=g.speedup,
        kv_transfer=node.transfer,
        kv_transfer_port=p.kv_transfer_port,
        kv_transfer_timeout_s=p.kv_transfer_timeout_s,
        host=p.host,
        advertise_host=p.advertise_host,
        metrics_port=p.metrics_port,
        queue_depth_threshold=node.queue_depth_threshold,
        export_interval_s=d.metrics.export_interval,
        drain_grace_s=p.drain_grace_s,
        group=rg.index,
        colocated=tuple(
            worker_spec(
                spec,
                c,
                # No transfer agent of its own: it lives in its host's process, role both.
                replace(c.group.nodes[0], kv_cache_transfer=False),
                instance_id=f"{instance_id}-m{k + 1}",
                device=device,
                threads=threads,
            )
            for k, c in enumerate(rg.colocated)
        ),
    )


def worker_specs(
    spec: ClusterSpec, groups: list[ResolvedGroup], *, prefix: str | None = None, cores: float | None = None
) -> list[WorkerSpec]:
    """One spec per device of every node group, in order (``w0-<pid>``, ``w1-<pid>``, ...).
    ``cores``: what the host offers its workers, headroom taken off (None: all of them)."""
    prefix = prefix or f"{os.getpid():x}"
    total = spec.deployment.num_workers
    if any(rg.group.engine == "vllm" and rg.group.num_workers for rg in groups):
        from interlock.engine import vllm

        if not vllm.installed():
            raise ConfigError(vllm.INSTALL_HINT)
    specs: list[WorkerSpec] = []
    for rg in groups:
        share = max(total, most_workers(spec, rg.group))
        threads = rg.group.threads or default_threads(cores or os.cpu_count() or 1, share)
        for node in rg.group.nodes:
            for _ in range(node.gpu_count):
                specs.append(
                    worker_spec(
                        spec,
                        rg,
                        node,
                        instance_id=f"w{len(specs)}-{prefix}",
                        # a worker of several ranks takes one device a rank (on CUDA)
                        device=device_of(
                            rg.group.device,
                            len(specs) * rg.group.tensor_parallel_size * rg.group.pipeline_parallel_size,
                        ),
                        threads=threads,
                    )
                )
    return specs


def device_of(device: str, index: int) -> str:
    """``cuda`` spreads a machine's workers over its devices in order (one device each);
    ``cpu`` and an explicit ``cuda:N`` are kept."""
    return f"cuda:{index}" if device == "cuda" else device


# ---- what a worker takes from its host (``planner.placement``) ----
MOCK_CORES = 0.25
"""The mock runner's share of a core: it sleeps through its modelled step times, so its CPU goes
to scheduling, the request plane and load reports (a mock worker streaming 64 requests used
0.15 of a core on a 2-core EPYC: ``benchmarks/startup_cost.py``). A quarter leaves room for
bursts and still lets a 2-core machine run eight."""
MOCK_PROCESS_BYTES = 128 << 20
"""A mock worker's memory (resident 58 MiB there: no torch, no weights)."""
WORKER_PROCESS_BYTES = 768 << 20
"""A model worker's process before its weights and KV: Python, torch, the tokenizer, the
planes (Interlock's CPU engine with SmolLM2-135M was resident at 969 MiB with 256 MiB of KV
and 270 MB of weights, so about 450 MiB; vLLM's engine core adds a process of its own)."""


def most_workers(spec: ClusterSpec, group: ExecutionGroup) -> int:
    """The most workers ``group`` may run at once, when something bounds it: its
    ``max_replicas``, else the planner's maximum (0: no bound, just those started)."""
    if group.max_replicas is not None:
        return group.max_replicas
    return spec.planner.total_max() if spec.planner is not None else 0


def default_threads(cores: float, workers: int) -> int:
    """A CPU worker's threads when its group says ``threads: 0``: an equal share of the
    host's cores among the most workers the group may run, at least one. Sharing among the
    most (not those started) keeps room for the ones a planner adds later."""
    return max(1, int(cores) // max(1, workers))


def process_needs(ws: WorkerSpec, rg: ResolvedGroup) -> Needs:
    """What ``ws``'s process takes from its host (``worker_needs``), the models it hosts beside
    its own included (their memory; they share its cores and the process itself). Reads the
    model folders' sizes and the measured footprints (``model_store.footprint``)."""
    needs = _model_needs(ws, rg)
    for c, crg in zip(ws.colocated, rg.colocated, strict=True):
        more = _model_needs(c, crg).memory_bytes - WORKER_PROCESS_BYTES
        needs = replace(needs, memory_bytes=needs.memory_bytes + more)
    return needs


def _model_needs(ws: WorkerSpec, rg: ResolvedGroup) -> Needs:
    weights, kv_token = model_footprint(rg.model_path)
    measured = footprint.measured(rg.model_path, ws.engine.model.dtype)
    return worker_needs(
        ws, rg.group, weights_bytes=weights, kv_token_bytes=kv_token, measured_weights=measured
    )


def worker_needs(
    ws: WorkerSpec,
    group: ExecutionGroup,
    *,
    weights_bytes: int,
    kv_token_bytes: int,
    measured_weights: int | None = None,
) -> Needs:
    """What ``ws`` takes from its host, estimated from its spec: a worker on a CUDA device
    drives ``tensor x pipeline`` devices and a core for its Python loop; the mock runner a
    fraction of a core (``MOCK_CORES``); a CPU engine (ours or vLLM's) its thread count in
    cores and the memory of its weights and KV pool (``kv_cache_gib``, or ``num_blocks`` of
    ``kv_token_bytes`` a token). The weights: what they held when Interlock's engine last loaded
    the model here with the same dtype setting, in one rank (``measured_weights``,
    ``model_store.footprint``: every layout its kernels keep), else their files' size
    (``weights_bytes``), doubled for a float32 model. Host KV tiers count too, except a shared
    one (one segment for all)."""
    m, c = ws.engine.model, ws.engine.cache
    tier = 0 if c.host_kv_shared else int(c.host_kv_gib * GIB)
    if m.device.startswith("cuda"):
        devices = group.tensor_parallel_size * group.pipeline_parallel_size
        return Needs(1.0, devices, WORKER_PROCESS_BYTES + tier)
    if m.engine == "interlock" and m.runner == "mock":  # its KV is 4 bytes a token: negligible
        return Needs(MOCK_CORES, 0, MOCK_PROCESS_BYTES + tier)
    weights = weights_bytes * (2 if m.dtype in ("float32", "fp32") else 1)
    if measured_weights and m.engine == "interlock" and m.ranks == 1:
        weights = measured_weights
    kv = int(c.kv_cache_gib * GIB) if c.num_blocks is None else c.num_blocks * c.block_size * kv_token_bytes
    # A group of ranks splits the weights and KV among its processes, each one more process.
    processes = m.ranks if m.engine == "interlock" else 1
    return Needs(float(max(1, m.num_threads)), 0, processes * WORKER_PROCESS_BYTES + weights + kv + tier)
