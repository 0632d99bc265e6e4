"""Deployment files for ``interlock serve -f cluster.yaml``: typed, frozen, validated once.

Every section and key is known; an unknown key or a bad value is rejected with a message that
names it (``routing.policy: 'fastest' is not one of ...``). Defaults give a one-machine
deployment of the default model with two aggregated workers.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from interlock.errors import ConfigError

ROLES = ("both", "prefill", "decode")
POLICIES = ("kv", "round-robin", "random", "least-loaded", "power-of-two")
"""Base policies. Session affinity, route keys and direct pins are per-request overlays
(headers), on top of whichever base policy is chosen."""
TRANSFERS = ("auto", "inproc", "shm", "tcp", "none")


@dataclass(frozen=True)
class ControlPlane:
    listen_host: str = "127.0.0.1"
    listen_port: int = 8000
    heartbeat_interval: float = 1.0
    heartbeat_timeout: float = 5.0
    health_checks: bool = True
    nats_url: str | None = None
    """None: ``serve`` starts its own nats-server."""


@dataclass(frozen=True)
class NodeGroup:
    node_role: str = "both"
    count: int = 1
    max_batch_size: int = 64
    queue_depth_threshold: int = 32
    """Waiting requests above which the worker counts as busy for routing: the router then
    queues new requests (its admission queue, ``routing.queue_size``) instead of sending them.
    Each worker registers it (``InstanceInfo.queue_depth_threshold``)."""
    kv_cache_transfer: str = "auto"
    max_num_batched_tokens: int = 2048
    kv_cache_gib: float = 1.0
    num_blocks: int | None = None


@dataclass(frozen=True)
class ExecutionGroup:
    model: str = "smollm2"
    served_model_name: str | None = None
    runner: str = "torch"
    device: str = "cpu"
    block_size: int = 16
    max_model_len: int = 2048
    nodes: tuple[NodeGroup, ...] = (NodeGroup(count=2),)


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


@dataclass(frozen=True)
class Metrics:
    export_interval: float = 5.0
    figures: tuple[str, ...] = ("requests", "ttft", "itl", "e2e", "tokens", "kv", "load")


@dataclass(frozen=True)
class Deployment:
    control_plane: ControlPlane = ControlPlane()
    execution_groups: tuple[ExecutionGroup, ...] = (ExecutionGroup(),)
    routing: Routing = Routing()
    metrics: Metrics = Metrics()

    @property
    def num_workers(self) -> int:
        return sum(n.count for g in self.execution_groups for n in g.nodes)


_METRIC_FIGURES = set(Metrics().figures)


def _build(cls: type, raw: Any, where: str) -> Any:
    """Build a frozen dataclass from a mapping, naming any unknown key or bad type."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(raw).__name__}")
    known = {f.name.replace("_", "-"): f for f in fields(cls)} | {f.name: f for f in fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        f = known.get(str(key))
        if f is None:
            names = ", ".join(sorted(x.name for x in fields(cls)))
            raise ConfigError(f"{where}.{key}: unknown key (known: {names})")
        kwargs[f.name] = _coerce(f.type, value, f"{where}.{key}")
    try:
        return cls(**kwargs)
    except TypeError as e:  # pragma: no cover - defensive
        raise ConfigError(f"{where}: {e}") from None


def _coerce(typ: Any, value: Any, where: str) -> Any:
    t = str(typ)
    if t.startswith("tuple[NodeGroup"):
        if not isinstance(value, list) or not value:
            raise ConfigError(f"{where}: expected a non-empty list of node groups")
        return tuple(_build(NodeGroup, v, f"{where}[{i}]") for i, v in enumerate(value))
    if t.startswith("tuple[str"):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where}: expected a list of strings")
        return tuple(value)
    base = t.replace(" | None", "")
    if value is None and "None" in t:
        return None
    checks: dict[str, tuple[type, ...]] = {
        "int": (int,), "float": (int, float), "bool": (bool,), "str": (str,)
    }
    want = checks.get(base)
    if want is None:
        return value
    if isinstance(value, bool) and base != "bool":
        raise ConfigError(f"{where}: expected {base}, got a boolean")
    if not isinstance(value, want):
        raise ConfigError(f"{where}: expected {base}, got {type(value).__name__} {value!r}")
    return float(value) if base == "float" else value  # type: ignore[arg-type]  # checked above


def validate_deployment(d: Deployment) -> None:
    cp = d.control_plane
    if not 0 < cp.listen_port < 65536:
        raise ConfigError(f"control-plane.listen_port: {cp.listen_port} is not a valid port")
    if cp.heartbeat_interval <= 0 or cp.heartbeat_timeout <= cp.heartbeat_interval:
        raise ConfigError("control-plane.heartbeat_timeout must be greater than heartbeat_interval > 0")
    for gi, g in enumerate(d.execution_groups):
        if g.runner not in ("torch", "mock"):
            raise ConfigError(f"execution-group.runner: {g.runner!r} is not one of torch, mock")
        if g.block_size < 1 or g.max_model_len < 1:
            raise ConfigError("execution-group.block_size and max_model_len must be positive")
        for i, n in enumerate(g.nodes):
            where = f"execution-group.nodes[{i}]" if gi == 0 else f"execution-groups[{gi}].nodes[{i}]"
            if n.node_role not in ROLES:
                raise ConfigError(f"{where}.node_role: {n.node_role!r} is not one of {', '.join(ROLES)}")
            if n.count < 0:
                raise ConfigError(f"{where}.count: must be >= 0")
            if n.max_batch_size < 1 or n.queue_depth_threshold < 1:
                raise ConfigError(f"{where}: max_batch_size and queue_depth_threshold must be >= 1")
            if n.kv_cache_transfer not in TRANSFERS:
                raise ConfigError(
                    f"{where}.kv_cache_transfer: {n.kv_cache_transfer!r} is not one of {', '.join(TRANSFERS)}"
                )
    r = d.routing
    if r.policy not in POLICIES:
        raise ConfigError(f"routing.policy: {r.policy!r} is not one of {', '.join(POLICIES)}")
    if r.route_key is not None and not r.route_key.strip():
        raise ConfigError("routing.route_key: must be a header name")
    if not 0.0 < r.kv_usage_watermark <= 1.0:
        raise ConfigError("routing.kv_usage_watermark: must be in (0, 1]")
    if d.metrics.export_interval <= 0:
        raise ConfigError("metrics.export_interval: must be positive")
    unknown = set(d.metrics.figures) - _METRIC_FIGURES
    if unknown:
        raise ConfigError(f"metrics.figures: unknown {sorted(unknown)} (known: {sorted(_METRIC_FIGURES)})")
    if d.num_workers < 1:
        raise ConfigError("execution-group.nodes: at least one worker is needed")


_SECTIONS = {
    "control-plane": "control_plane",
    "execution-group": "execution_groups",
    "execution-groups": "execution_groups",
    "routing": "routing",
    "metrics": "metrics",
}


def parse_deployment(raw: Any) -> Deployment:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError("deployment file: expected a mapping at the top level")
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        name = _SECTIONS.get(str(key).replace("_", "-"))
        if name is None:
            raise ConfigError(f"{key}: unknown section (known: {', '.join(sorted(set(_SECTIONS) - {'execution-groups'}))})")
        if name == "control_plane":
            kwargs[name] = _build(ControlPlane, value, "control-plane")
        elif name == "routing":
            kwargs[name] = _build(Routing, value, "routing")
        elif name == "metrics":
            kwargs[name] = _build(Metrics, value, "metrics")
        else:
            groups = value if isinstance(value, list) else [value]
            kwargs[name] = tuple(_build(ExecutionGroup, g, str(key)) for g in groups)
    d = Deployment(**kwargs)
    validate_deployment(d)
    return d


def load_deployment(path: str | Path) -> Deployment:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read deployment file {p}: {e.strerror}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML: {e}") from None
    return parse_deployment(raw)


__all__ = [
    "ControlPlane", "Deployment", "ExecutionGroup", "Metrics", "NodeGroup", "Routing",
    "load_deployment", "parse_deployment", "validate_deployment",
]
