"""Deployments: typed, frozen, validated once, whether they come from a file, flags or Python.

    control-plane: {listen_port: 8000, heartbeat_interval: 5s, health_check_enabled: true}
    execution-group:
      nodes:
        - {node_role: prefill, gpu_count: 2, max_num_seqs: 32, queue_depth_threshold: 24}
        - {node_role: decode, gpu_count: 4, max_num_seqs: 64, kv_cache_transfer: true, cache_transport: tcp}
    routing: {policy: least-loaded, route_key: x-business-line, fallback_to_local: true, preempt_enabled: false}
    metrics: {export_interval: 10s, collect_queue_depth: true, collect_gpu_utilization: true, collect_kv_cache_miss: true}

Every section and key is known and acts; an unknown key or a bad value is refused with a
message naming it (``routing.policy: 'fastest' is not one of ...``). Durations take units
(``5s``, ``500ms``, ``2m``; a plain number is seconds). Older key names are aliases
(``count`` for ``gpu_count``, ``max_batch_size`` for ``max_num_seqs``, ``health_checks`` for
``health_check_enabled``, ``kv_cache_transfer: tcp`` for ``kv_cache_transfer: true,
cache_transport: tcp``, ...).

A *device* is what one worker process drives: ``gpu_count: 4`` starts four workers of the
group, one per device (until tensor parallelism groups several devices under one worker).
With ``device: cuda`` the workers on one machine get ``cuda:0``, ``cuda:1``, ... in order;
on ``cpu`` a device is a worker process with an equal share of the machine's cores
(``threads``, default cores / workers) and its own KV pool (``kv_cache_gib`` or ``num_blocks``).

``interlock.cluster`` turns a ``Deployment`` into running processes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from interlock.errors import ConfigError
from interlock.names import (
    DTYPES,
    ENGINES,
    KV_INDEX_MODES,
    POLICIES,
    ROLES,
    RUNNERS,
    STALL_OVER,
    TRANSPORTS,
    policy_name,
)

METRIC_FAMILIES = (
    "requests",
    "ttft",
    "itl",
    "e2e",
    "tokens",
    "kv",
    "queue_depth",
    "gpu_utilization",
    "kv_cache_miss",
)
"""Families of figures on ``/metrics`` (see ``interlock.frontend.metrics.FAMILIES`` for the
metric names in each); ``metrics.figures`` lists those exported."""
_FAMILY_ALIASES = {"load": "queue_depth"}

# Defaults of what the engine's config and a node group share, defined once here (this module sits
# below the engine: ``interlock.engine.config`` imports them; the flags show them).
DEFAULT_MAX_NUM_SEQS = 64
"""Requests one worker runs at once unless told (``max_num_seqs``, as vLLM names it)."""
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048
"""Tokens one engine step computes at most unless told (``max_num_batched_tokens``)."""
DEFAULT_KV_CACHE_GIB = 1.0
"""Device KV cache per worker, GiB, unless ``kv_cache_gib`` or ``num_blocks`` says otherwise."""
DEFAULT_TIER_LOAD_TIMEOUT_S = 2.0
"""Floor of a host- or disk-tier load's deadline, seconds (``interlock.engine.tiers.deadline``)."""
DEFAULT_TIER_LOAD_MIN_MIB_S = 50.0
"""Slowest read rate, MiB/s, a working tier is allowed when that deadline is sized."""


MAX_KV_SHARDS = 1024
"""Most shards of the KV index (``routing.kv_shard``): every lookup asks each once."""
MAX_FRONTEND_WORKERS = 64
"""Most frontend processes on one port (``control-plane.frontend_workers``)."""


@dataclass(frozen=True)
class ControlPlane:
    listen_host: str = "127.0.0.1"
    """Interface the HTTP frontend listens on."""
    listen_port: int = 8000
    frontend_workers: int = 1
    """Frontend processes serving ``listen_port`` together (SO_REUSEPORT): each parses, tokenizes
    and routes the requests the kernel hands it, their routers share state as replicas do, and
    ``/metrics`` and the dashboard show them as one (``cluster.frontends``)."""
    heartbeat_interval: float = 1.0
    """Seconds between lease renewals of every process in discovery."""
    heartbeat_timeout: float | None = None
    """A process silent this long leaves discovery; None: five heartbeat intervals."""
    health_check_enabled: bool = True
    """Routers ping every worker each ``heartbeat_interval``; one that misses two pings in a row
    gets no requests until it answers again. Off: only leases and request failures take a worker
    out."""
    nats_url: str | None = None
    """None: ``serve`` starts its own nats-server (loopback, private login)."""

    @property
    def lease_timeout(self) -> float:
        return self.heartbeat_timeout if self.heartbeat_timeout is not None else 5 * self.heartbeat_interval


@dataclass(frozen=True)
class NodeGroup:
    node_role: str = "both"
    gpu_count: int = 1
    """Devices of this group: one worker process per device (module docstring)."""
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    """Requests one worker runs at once (its scheduler's ``max_num_seqs``; older key:
    ``max_batch_size``)."""
    queue_depth_threshold: int = 32
    """Waiting requests above which the worker counts as busy for routing: the router then
    queues new requests (its admission queue, ``routing.queue_size``) instead of sending them.
    Each worker registers it (``InstanceInfo.queue_depth_threshold``)."""
    kv_cache_transfer: bool = True
    """Workers of this group run a KV transfer agent (needed to hand KV to, or take it from,
    another worker: disaggregation). False: they can only serve aggregated."""
    cache_transport: str = "auto"
    """How a worker pulls KV from a peer: ``auto`` picks per peer (in-process, shared memory on
    one host, else TCP); ``shm``/``tcp``/``inproc`` force one (a pull the forced transport cannot
    make fails, and the worker computes the prompt itself). ``tcp`` also never stages KV in
    /dev/shm."""
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    kv_cache_gib: float = DEFAULT_KV_CACHE_GIB
    num_blocks: int | None = None
    host_kv_gib: float = 0.0
    """Host-memory KV tier below each worker's pool, GiB (0: none; ``docs/design.md``, "KV tiers")."""
    host_kv_shared: str | None = None
    """Share the host tier between this host's workers of this name (a /dev/shm segment)."""
    disk_kv_gib: float = 0.0
    """Disk KV tier per worker, GiB (0: none); files under ``disk_kv_path``."""
    disk_kv_path: str | None = None
    tier_load_timeout_s: float = DEFAULT_TIER_LOAD_TIMEOUT_S
    """A load from the host or disk tier not done within this many seconds, plus its bytes at
    ``tier_load_min_mib_s``, is abandoned and the request computes those blocks (a hung or
    dying disk; ``CacheConfig.tier_load_timeout_s``)."""
    tier_load_min_mib_s: float = DEFAULT_TIER_LOAD_MIN_MIB_S
    """The slowest read rate, MiB/s, that deadline allows a working tier (it catches hangs, not
    slow disks)."""
    shared_kv_cache: bool | None = None
    """Each worker's KV cache on a memfd, so a decode worker of the same host copies a
    prefill's blocks straight out of it (the one copy) instead of an export and an import
    around a staged payload. None (auto): on for CPU workers with a KV transfer agent that may
    use shared memory and that may serve prefill to another: role prefill, or role both
    without a host or disk KV tier (their onboarding writes into the cache, and shared memory
    gets no huge pages where ``shmem_enabled`` is "never": 74% against 110% of a memcpy,
    BENCHMARKS.md). True where it cannot apply is refused (a GPU cache, no agent,
    ``cache_transport: tcp``)."""

    @property
    def transfer(self) -> str:
        """The worker's transfer setting: ``none`` or the transport."""
        return self.cache_transport if self.kv_cache_transfer else "none"


@dataclass(frozen=True)
class ExecutionGroup:
    model: str = "smollm2"
    served_model_name: str | None = None
    engine: str = "interlock"
    """``interlock`` (this project's engine, ``runner`` says which runner) or ``vllm`` (vLLM's
    async engine in each worker process: docs/vllm.md)."""
    engine_args: tuple[tuple[str, Any], ...] = ()
    """vLLM only: more of vLLM's engine arguments, a mapping named as vLLM names them
    (``{enforce_eager: true}``); they win over what Interlock's keys map to. Unknown names, and
    those the worker owns (``model``, ``kv_events_config``, ...), are refused by name."""
    runner: str = "torch"
    device: str = "cpu"
    dtype: str = "auto"
    """bf16, fp32 or fp16; ``auto``: bf16 where this machine computes it fast, else fp32
    (measured, ``engine.model.dtype_choice``)."""
    block_size: int | None = None
    """Tokens per KV block; None: the engine's default (``default_block_size``: 16, or 32 for
    vLLM on a CPU, whose blocks must be a multiple of 32)."""
    max_model_len: int | None = None
    """None: the model's own context length (``max_position_embeddings``)."""
    enable_prefix_caching: bool = True
    threads: int = 0
    """torch threads per worker; 0: the machine's cores shared equally among its workers."""
    speedup: float = 1.0
    """Mock runner only: its modelled step times are divided by this."""
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    """Ranks of each worker's model (``tensor x pipeline`` processes on one host; vLLM's own
    parallelism for engine vllm). The model must cut that way (``engine.model.partition``)."""
    max_replicas: int | None = None
    """Most workers this group may have at once: ``RunningCluster.add_worker`` refuses more
    (the planner scales within it). None: no bound."""
    optimization_profile: str | None = None
    """``high_throughput`` or ``low_latency``: the placement optimizer chooses the tensor and
    pipeline sizes on the host at start (``cluster.layout``; sizes other than 1 given here are
    kept, as pins). None: the sizes as given."""
    offload_after_s: float = 0.0
    """Drop the model's weights after this long without a request; the next one loads them
    again (its time to first token pays the load). 0: they stay."""
    colocate: tuple[ExecutionGroup, ...] = ()
    """More models each worker of this group hosts in its own process (and device), each with
    its own engine, KV budget (its one node group's ``kv_cache_gib`` or ``num_blocks``) and
    served name, registered as an instance of its own. A colocated group has one node group
    of count 1 (written or not) and no colocated groups of its own."""
    nodes: tuple[NodeGroup, ...] = (NodeGroup(gpu_count=2),)

    @property
    def num_workers(self) -> int:
        return sum(n.gpu_count for n in self.nodes)


@dataclass(frozen=True)
class Routing:
    policy: str = "kv"
    route_key: str | None = None
    """HTTP header whose value picks a consistent subset of workers (e.g. x-business-line)."""
    fallback_to_local: bool = True
    """Disaggregation: a request that cannot be prefilled remotely is prefilled on its decode
    worker (False: it fails with 503, like ``enforce_disagg``)."""
    enforce_disagg: bool = False
    """Prefill every request remotely when prefill workers exist (no per-request choice)."""
    max_remote_kv_bytes: int = 1 << 30
    """Requests with more KV than this are prefilled where they decode."""
    preempt_enabled: bool = False
    """Workers let a more important waiting request (lower ``priority``, see
    ``interlock.protocol.generate``) preempt a less important running one when KV blocks or
    batch slots run out (``interlock worker --preempt-enabled``). Off: nothing running is
    preempted for priority."""
    kv_usage_watermark: float = 0.7
    queue_size: int = 256
    stall_over: str = "decoding"
    """Whom the ``kv`` cost's stall term counts on each worker: ``decoding`` (the requests past
    their first token) or ``inflight`` (every request there: better SLA on large fleets at
    moderate load, fewer hits far past saturation; BENCHMARKS.md, Router at scale)."""
    migration_limit: int = 3
    """Times a request whose worker fails mid-stream moves to another worker (0: off; the
    client gets the error). ``--migration-limit``; the Python API's ``migration_limit``."""
    stall_timeout_s: float = 10.0
    """Seconds without a token (once the first is out) after which a stream counts as stalled
    and migrates; raised on workers with slow steps. ``--stall-timeout``."""
    queue_timeout_s: float = 30.0
    """Seconds a request waits for a worker: for a free one when every worker is busy, and for
    the first one of a pool scaled to zero (raise it above the workers' start-up: a vLLM worker
    takes about 70 s to serve on a CPU). Then 503 + Retry-After."""
    kv_index: str = "local"
    """``local``: the router keeps the fleet's KV index (ingests every KV event) and answers
    other frontends' lookups; ``remote``: it keeps none and asks a ``local`` one per request, so
    several frontends share one ingestion (``docs/scale.md``). ``--kv-index``."""
    kv_shard: str = ""
    """``I/N``: keep only shard I of N of the KV index (the workers whose ids hash to it) and
    route by asking every shard per request; "": the whole index. ``--kv-shard``."""


@dataclass(frozen=True)
class Metrics:
    export_interval: float = 1.0
    """Workers publish their load and figures at least this often (and after engine steps,
    at most every 50 ms, while busy)."""
    figures: tuple[str, ...] = METRIC_FAMILIES
    collect_queue_depth: bool = True
    collect_gpu_utilization: bool = True
    collect_kv_cache_miss: bool = True

    @property
    def families(self) -> frozenset[str]:
        """Families exported on ``/metrics``: ``figures`` less those switched off."""
        off = {
            name
            for name, on in (
                ("queue_depth", self.collect_queue_depth),
                ("gpu_utilization", self.collect_gpu_utilization),
                ("kv_cache_miss", self.collect_kv_cache_miss),
            )
            if not on
        }
        return frozenset(_FAMILY_ALIASES.get(f, f) for f in self.figures) - off


@dataclass(frozen=True)
class Deployment:
    control_plane: ControlPlane = ControlPlane()
    execution_groups: tuple[ExecutionGroup, ...] = (ExecutionGroup(),)
    routing: Routing = Routing()
    metrics: Metrics = Metrics()

    @property
    def num_workers(self) -> int:
        return sum(g.num_workers for g in self.execution_groups)

    @property
    def nodes(self) -> tuple[NodeGroup, ...]:
        return tuple(n for g in self.execution_groups for n in g.nodes)

    @property
    def disaggregated(self) -> bool:
        return any(n.node_role != "both" for n in self.nodes)


_ALIASES: dict[type, dict[str, str]] = {
    ControlPlane: {
        "health_checks": "health_check_enabled",
        "host": "listen_host",
        "port": "listen_port",
        "api_server_count": "frontend_workers",
    },
    NodeGroup: {"count": "gpu_count", "role": "node_role", "max_batch_size": "max_num_seqs"},
    Routing: {"router_mode": "policy"},
}
"""Older or ecosystem names of keys (Dynamo's ``router_mode``, this file's older ``max_batch_size``)."""
_DURATIONS = {"heartbeat_interval", "heartbeat_timeout", "export_interval"}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h)?\s*$")
_UNIT_S = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(value: Any, where: str) -> float:
    """Seconds from ``5s``, ``500ms``, ``2m``, ``1h`` or a plain number of seconds."""
    if isinstance(value, bool):
        raise ConfigError(f"{where}: expected a duration (5s, 500ms, 2m or seconds), got a boolean")
    if isinstance(value, int | float):
        return float(value)
    m = _DURATION.match(str(value))
    if m is None:
        raise ConfigError(f"{where}: expected a duration (5s, 500ms, 2m or seconds), got {value!r}")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def _build(cls: type, raw: Any, where: str) -> Any:
    """Build a frozen dataclass from a mapping, naming any unknown key or bad type."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(raw).__name__}")
    by_name = {f.name: f for f in fields(cls)}
    aliases = _ALIASES.get(cls, {})
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        name = str(key).replace("-", "_")
        name = aliases.get(name, name)
        f = by_name.get(name)
        if f is None:
            names = ", ".join(sorted(by_name))
            raise ConfigError(f"{where}.{key}: unknown key (known: {names})")
        if name in kwargs:
            raise ConfigError(f"{where}.{key}: given twice (as {name} and an alias)")
        if cls is NodeGroup and name == "kv_cache_transfer" and isinstance(value, str):
            kwargs.update(_legacy_transfer(value, raw, f"{where}.{key}"))
            continue
        if cls is Routing and name == "policy" and isinstance(value, str):
            value = policy_name(value)
        if name in _DURATIONS and value is not None:
            kwargs[name] = parse_duration(value, f"{where}.{key}")
            continue
        kwargs[name] = _coerce(f.type, value, f"{where}.{key}")
    return cls(**kwargs)


def node_group(raw: Mapping[str, Any], where: str) -> NodeGroup:
    """A node group from a mapping of its keys (the Python API's ``create_serving_instance``
    keywords), read as the file reads one: aliases, unknown keys and bad types refused by name."""
    built: NodeGroup = _build(NodeGroup, dict(raw), where)
    return built


def _legacy_transfer(value: str, raw: dict[Any, Any], where: str) -> dict[str, Any]:
    """``kv_cache_transfer: none|auto|shm|tcp|inproc`` (before it was a switch)."""
    if value == "none":
        return {"kv_cache_transfer": False}
    if value not in TRANSPORTS:
        raise ConfigError(
            f"{where}: expected true or false (or a transport: {', '.join(TRANSPORTS)}), got {value!r}"
        )
    given = raw.get("cache_transport", raw.get("cache-transport"))
    if given is not None and given != value:
        raise ConfigError(f"{where}: {value!r} contradicts cache_transport {given!r}")
    return {"kv_cache_transfer": True, "cache_transport": value}


def _colocated(raw: Any, where: str) -> ExecutionGroup:
    """A colocated group from the file: its node group is one of count 1 unless written."""
    if isinstance(raw, dict) and not {"nodes", "node"} & {str(k) for k in raw}:
        raw = {**raw, "nodes": [{"count": 1}]}
    built: ExecutionGroup = _build(ExecutionGroup, raw, where)
    return built


def _coerce(typ: Any, value: Any, where: str) -> Any:
    t = str(typ)
    if t.startswith("tuple[tuple[str, Any]"):
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise ConfigError(f"{where}: expected a mapping of vLLM engine argument names to values")
        return tuple((k.replace("-", "_"), v) for k, v in value.items())
    if t.startswith("tuple[NodeGroup"):
        if not isinstance(value, list) or not value:
            raise ConfigError(f"{where}: expected a non-empty list of node groups")
        return tuple(_build(NodeGroup, v, f"{where}[{i}]") for i, v in enumerate(value))
    if t.startswith("tuple[ExecutionGroup"):
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list of execution groups (model, served_model_name, ...)")
        return tuple(_colocated(v, f"{where}[{i}]") for i, v in enumerate(value))
    if t.startswith("tuple[str"):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where}: expected a list of strings")
        return tuple(value)
    base = t.replace(" | None", "")
    if value is None and "None" in t:
        return None
    checks: dict[str, tuple[type, ...]] = {
        "int": (int,),
        "float": (int, float),
        "bool": (bool,),
        "str": (str,),
    }
    want = checks.get(base)
    if want is None:  # pragma: no cover - every field type is listed above
        raise ConfigError(f"{where}: unsupported type {t}")
    if isinstance(value, bool) and base != "bool":
        raise ConfigError(f"{where}: expected {base}, got a boolean")
    if not isinstance(value, want):
        raise ConfigError(f"{where}: expected {base}, got {type(value).__name__} {value!r}")
    return float(value) if base == "float" else value  # type: ignore[arg-type]  # checked above


def _one_of(value: str, choices: tuple[str, ...], where: str) -> None:
    if value not in choices:
        raise ConfigError(f"{where}: {value!r} is not one of {', '.join(choices)}")


def parse_shard(text: str) -> tuple[int, int]:
    """``"I/N"`` as (I, N): shard I of N, 0 <= I < N; ``""``: (0, 1), the whole index."""
    if not text:
        return 0, 1
    index, sep, count = text.partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        i, n = -1, 0
    if not sep or not 0 <= i < n or n > MAX_KV_SHARDS:
        raise ConfigError(
            f"kv_shard: {text!r} is not I/N with 0 <= I < N <= {MAX_KV_SHARDS} (e.g. 0/4)", param="kv_shard"
        )
    return i, n


def validate_deployment(d: Deployment) -> None:
    cp = d.control_plane
    if not 0 <= cp.listen_port < 65536:
        raise ConfigError(f"control-plane.listen_port: {cp.listen_port} is not a valid port")
    if not 1 <= cp.frontend_workers <= MAX_FRONTEND_WORKERS:
        raise ConfigError(
            f"control-plane.frontend_workers: {cp.frontend_workers} is not within 1..{MAX_FRONTEND_WORKERS}"
        )
    if cp.heartbeat_interval <= 0 or cp.lease_timeout <= cp.heartbeat_interval:
        raise ConfigError("control-plane.heartbeat_timeout must be greater than heartbeat_interval > 0")
    for gi, g in enumerate(d.execution_groups):
        at = "execution-group" if gi == 0 else f"execution-groups[{gi}]"
        _validate_group(g, at)
    r = d.routing
    _one_of(r.policy, POLICIES, "routing.policy")
    _one_of(r.stall_over, STALL_OVER, "routing.stall_over")
    _one_of(r.kv_index, KV_INDEX_MODES, "routing.kv_index")
    if r.kv_shard:
        _, count = parse_shard(r.kv_shard)
        if count > 1 and r.kv_index != "local":
            raise ConfigError("routing.kv_shard: a shard of the index is kept with kv_index local")
    if r.route_key is not None and not r.route_key.strip():
        raise ConfigError("routing.route_key: must be a header name")
    if not 0.0 < r.kv_usage_watermark <= 1.0:
        raise ConfigError("routing.kv_usage_watermark: must be in (0, 1]")
    if r.queue_size < 0 or r.max_remote_kv_bytes < 0:
        raise ConfigError("routing.queue_size and max_remote_kv_bytes must be >= 0")
    if r.migration_limit < 0:
        raise ConfigError("routing.migration_limit must be >= 0", param="migration_limit")
    if not r.stall_timeout_s > 0:
        raise ConfigError("routing.stall_timeout_s must be positive", param="stall_timeout_s")
    if not r.queue_timeout_s > 0:
        raise ConfigError("routing.queue_timeout_s must be positive", param="queue_timeout_s")
    if r.preempt_enabled and any(g.engine != "interlock" for g in d.execution_groups):
        raise ConfigError("routing.preempt_enabled: the interlock engine's; vLLM preempts by its own policy")
    if d.metrics.export_interval <= 0:
        raise ConfigError("metrics.export_interval: must be positive")
    known = set(METRIC_FAMILIES) | set(_FAMILY_ALIASES)
    unknown = set(d.metrics.figures) - known
    if unknown:
        raise ConfigError(f"metrics.figures: unknown {sorted(unknown)} (known: {', '.join(METRIC_FAMILIES)})")


def default_block_size(engine: str, device: str) -> int:
    """Tokens per KV block when the group does not say: vLLM on a CPU needs a multiple of 32
    (32: the finest the router can match prefixes at), elsewhere 16."""
    return 32 if engine == "vllm" and device == "cpu" else 16


OPTIMIZATION_PROFILES = ("high_throughput", "low_latency")
"""The placement optimizer's profiles (``planner.parallel_plan.PROFILES``, one list: a test
holds them equal)."""
_NODE_DEFAULTS = NodeGroup()
_VLLM_REFUSED_NODE = {
    "host_kv_gib": "vLLM's own KV offloading is an engine_arg (kv_offloading_size)",
    "disk_kv_gib": "vLLM's own KV offloading is an engine_arg",
    "host_kv_shared": "the shared host tier is the interlock engine's",
    "tier_load_timeout_s": "the host and disk tiers are the interlock engine's",
    "tier_load_min_mib_s": "the host and disk tiers are the interlock engine's",
    "shared_kv_cache": "the one-copy KV cache is the interlock engine's",
}


def _validate_vllm_group(g: ExecutionGroup, at: str) -> None:
    """What a vLLM group cannot honour, refused by name."""
    if g.engine != "vllm":
        if g.engine_args:
            raise ConfigError(f"{at}.engine_args: vLLM's engine arguments need engine: vllm")
        return
    if g.runner != "torch":
        raise ConfigError(f"{at}.runner: {g.runner!r} is the interlock engine's (engine vllm runs vLLM)")
    if g.speedup != 1.0:
        raise ConfigError(f"{at}.speedup: only the interlock engine's mock runner takes one")
    if g.device == "cpu" and g.pipeline_parallel_size > 1:
        raise ConfigError(
            f"{at}.pipeline_parallel_size: vLLM's CPU pipeline (0.32) answered greedy requests "
            "differently from one stage here (docs/partitioning.md); use Interlock's engine for stages"
        )
    bs = g.block_size
    if bs is not None and g.device == "cpu" and bs % 32:
        raise ConfigError(f"{at}.block_size: vLLM on a CPU needs a multiple of 32, got {bs}")
    for i, n in enumerate(g.nodes):
        where = f"{at}.nodes[{i}]"
        if n.cache_transport == "inproc":
            raise ConfigError(f"{where}.cache_transport: vLLM workers hand KV over NIXL (auto, shm or tcp)")
        for key, why in _VLLM_REFUSED_NODE.items():
            value = getattr(n, key)
            if value and value != getattr(_NODE_DEFAULTS, key):
                raise ConfigError(f"{where}.{key}: not with engine vllm: {why}")


def offload_refused(engine: str, runner: str, ranks: int, device: str) -> str:
    """Why a model of this kind cannot drop its idle weights ("" where it can): Interlock's
    torch runner of one rank (it reloads from the converted files), or vLLM on CUDA (its sleep
    mode; vLLM offers it on no CPU)."""
    if engine == "vllm":
        return (
            ""
            if device.startswith("cuda")
            else "vLLM's sleep mode needs a CUDA device (this worker's is a CPU)"
        )
    if runner != "torch":
        return "the mock runner has no weights to drop"
    if ranks > 1:
        return "only Interlock's engine of one rank drops idle weights (a group of ranks keeps them)"
    return ""


def _validate_colocated(g: ExecutionGroup, at: str) -> None:
    """What a group hosting other models, and each model it hosts, must be."""
    if g.offload_after_s < 0:
        raise ConfigError(f"{at}.offload_after_s: must be >= 0")
    if g.offload_after_s:
        why = offload_refused(g.engine, g.runner, g.tensor_parallel_size * g.pipeline_parallel_size, g.device)
        if why:
            raise ConfigError(f"{at}.offload_after_s: {why}")
    if not g.colocate:
        return
    if g.engine != "interlock" or g.tensor_parallel_size * g.pipeline_parallel_size > 1:
        raise ConfigError(f"{at}.colocate: a worker of the interlock engine with one rank hosts other models")
    names = {g.served_model_name or g.model}
    for i, c in enumerate(g.colocate):
        where = f"{at}.colocate[{i}]"
        _validate_group(c, where)
        if c.colocate:
            raise ConfigError(f"{where}.colocate: a colocated model hosts no models of its own")
        if c.engine != "interlock" or c.tensor_parallel_size * c.pipeline_parallel_size > 1:
            raise ConfigError(f"{where}: a colocated model runs on the interlock engine, one rank")
        if c.device != g.device:
            raise ConfigError(f"{where}.device: {c.device!r} is not its host worker's {g.device!r}")
        if len(c.nodes) != 1 or c.nodes[0].gpu_count != 1 or c.nodes[0].node_role != "both":
            raise ConfigError(
                f"{where}.nodes: one node group of count 1 and role both (it lives in each worker)"
            )
        name = c.served_model_name or c.model
        if name in names:
            raise ConfigError(f"{where}.served_model_name: {name!r} is served twice by one worker")
        names.add(name)


def _validate_group(g: ExecutionGroup, at: str) -> None:
    _one_of(g.engine, ENGINES, f"{at}.engine")
    if g.optimization_profile is not None:
        _one_of(g.optimization_profile, OPTIMIZATION_PROFILES, f"{at}.optimization_profile")
        if g.engine != "interlock":
            raise ConfigError(
                f"{at}.optimization_profile: chosen for the interlock engine's cut rules; "
                "give vLLM its sizes (tensor_parallel_size, pipeline_parallel_size)"
            )
    _validate_colocated(g, at)
    _validate_vllm_group(g, at)
    _one_of(g.runner, RUNNERS, f"{at}.runner")
    _one_of(g.dtype, DTYPES, f"{at}.dtype")
    if (g.block_size is not None and g.block_size < 1) or (
        g.max_model_len is not None and g.max_model_len < 1
    ):
        raise ConfigError(f"{at}: block_size and max_model_len must be positive")
    ranks = g.tensor_parallel_size * g.pipeline_parallel_size
    if g.tensor_parallel_size < 1 or g.pipeline_parallel_size < 1:
        raise ConfigError(f"{at}: tensor_parallel_size and pipeline_parallel_size must be >= 1")
    if ranks > 1 and g.engine == "interlock":
        if g.runner != "torch":
            raise ConfigError(f"{at}.runner: tensor/pipeline parallelism runs the real model (runner torch)")
        for i, n in enumerate(g.nodes):
            if n.node_role != "both":
                raise ConfigError(
                    f"{at}.nodes[{i}].node_role: {n.node_role} needs KV transfer, which a worker "
                    "of several ranks does not do yet (only both)"
                )
    if g.runner == "mock" and g.dtype != "auto":
        raise ConfigError(f"{at}.dtype: the mock runner has no dtype (only the torch runner takes one)")
    if g.speedup <= 0 or (g.speedup != 1.0 and g.runner != "mock"):
        raise ConfigError(f"{at}.speedup: only the mock runner takes one, and it must be positive")
    if g.threads < 0:
        raise ConfigError(f"{at}.threads: must be >= 0")
    if g.max_replicas is not None and g.max_replicas < g.num_workers:
        raise ConfigError(
            f"{at}.max_replicas: {g.max_replicas} is fewer than the {g.num_workers} workers its nodes start"
        )
    for i, n in enumerate(g.nodes):
        where = f"{at}.nodes[{i}]"
        _one_of(n.node_role, ROLES, f"{where}.node_role")
        if n.gpu_count < 0:
            raise ConfigError(f"{where}.gpu_count: must be >= 0")
        if n.max_num_seqs < 1 or n.queue_depth_threshold < 1 or n.max_num_batched_tokens < 1:
            raise ConfigError(
                f"{where}: max_num_seqs, queue_depth_threshold and max_num_batched_tokens must be >= 1"
            )
        for key in ("tier_load_timeout_s", "tier_load_min_mib_s"):
            if not 0 < getattr(n, key) < math.inf:
                raise ConfigError(f"{where}.{key}: must be positive and finite")
        _one_of(n.cache_transport, TRANSPORTS, f"{where}.cache_transport")
        if n.shared_kv_cache and (why := shared_cache_refusal(g, n)):
            raise ConfigError(f"{where}.shared_kv_cache: {why}")
        if n.node_role != "both" and not n.kv_cache_transfer:
            raise ConfigError(
                f"{where}.kv_cache_transfer: a {n.node_role} worker needs it (KV "
                "moves between prefill and decode workers)"
            )


def shared_cache_refusal(g: ExecutionGroup, n: NodeGroup) -> str:
    """Why workers of node group ``n`` cannot put their KV cache on a memfd ("": they can)."""
    if g.device != "cpu":
        return f"needs the KV cache on the CPU, not on {g.device!r}"
    if g.tensor_parallel_size * g.pipeline_parallel_size > 1:
        return "a worker of several ranks does not export KV blocks yet"
    if not n.kv_cache_transfer or n.cache_transport == "tcp":
        return "needs a KV transfer agent that may use shared memory (kv_cache_transfer, cache_transport not tcp)"
    return ""


def shared_kv_cache(g: ExecutionGroup, n: NodeGroup) -> bool:
    """Node group ``n``'s ``shared_kv_cache``, auto resolved (see ``NodeGroup``)."""
    if n.shared_kv_cache is not None:
        return n.shared_kv_cache
    if (
        g.engine != "interlock"
        or n.node_role == "decode"
        or (n.node_role == "both" and (n.host_kv_gib or n.disk_kv_gib))
    ):
        return False
    return not shared_cache_refusal(g, n)


_SECTIONS = {
    "control-plane": "control_plane",
    "execution-group": "execution_groups",
    "execution-groups": "execution_groups",
    "routing": "routing",
    "metrics": "metrics",
}
_SECTION_TYPES: dict[str, type] = {"control_plane": ControlPlane, "routing": Routing, "metrics": Metrics}
PLANNER_SECTION = "planner"
"""The planner's section: ``interlock serve`` reads it (``interlock.planner.flags``, through
``parse_planner_config``; the planner sits above this module, so it is not parsed here) and
passes ``read_by=(PLANNER_SECTION,)``; every other reader refuses it by name."""

PLACEMENT_SECTION = "placement"
"""What this host offers the workers (``cluster.spec.parse_placement``): ``interlock serve``
places the workers it starts and reads it; every other reader refuses it by name."""


def parse_deployment(raw: Any, *, read_by: tuple[str, ...] = ()) -> Deployment:
    """``read_by``: top-level sections the caller reads itself (skipped here, not ignored)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError("deployment file: expected a mapping at the top level")
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        if key in read_by:
            continue
        name = _SECTIONS.get(str(key).replace("_", "-"))
        if name is None and key == PLANNER_SECTION:
            raise ConfigError(
                "planner: only `interlock serve` runs a planner (this command does not read the section)"
            )
        if name is None and key == PLACEMENT_SECTION:
            raise ConfigError(
                "placement: only `interlock serve` places the workers it starts (this command "
                "does not read the section)"
            )
        if name is None:
            known = ", ".join(sorted(set(_SECTIONS) - {"execution-groups"}))
            raise ConfigError(f"{key}: unknown section (known: {known})")
        if name in _SECTION_TYPES:
            kwargs[name] = _build(_SECTION_TYPES[name], value, str(key))
        else:
            groups = value if isinstance(value, list) else [value]
            kwargs[name] = tuple(_build(ExecutionGroup, g, str(key)) for g in groups)
    d = Deployment(**kwargs)
    validate_deployment(d)
    if d.num_workers < 1 and PLANNER_SECTION not in read_by:  # serve: 0 with a planner whose min is 0
        raise ConfigError("execution-group.nodes: at least one worker (gpu_count) is needed")
    return d


def load_deployment(path: str | Path, *, read_by: tuple[str, ...] = ()) -> Deployment:
    """``read_by``: as for ``parse_deployment``."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read deployment file {p}: {e.strerror}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML: {e}") from None
    return parse_deployment(raw, read_by=read_by)


__all__ = [
    "DEFAULT_KV_CACHE_GIB",
    "DEFAULT_MAX_NUM_BATCHED_TOKENS",
    "DEFAULT_MAX_NUM_SEQS",
    "DEFAULT_TIER_LOAD_MIN_MIB_S",
    "DEFAULT_TIER_LOAD_TIMEOUT_S",
    "METRIC_FAMILIES",
    "PLANNER_SECTION",
    "ControlPlane",
    "Deployment",
    "ExecutionGroup",
    "Metrics",
    "NodeGroup",
    "Routing",
    "load_deployment",
    "node_group",
    "parse_deployment",
    "parse_duration",
    "validate_deployment",
]
