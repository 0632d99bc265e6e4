"""Flags shared by ``serve``, ``frontend`` and ``worker``, and the one function turning them into
a ``ClusterSpec`` for ``interlock.cluster``'s builder.

Names follow vLLM and Dynamo where they name the same thing (``--tensor-parallel-size``,
``--enable-prefix-caching``, ``--router-mode``). With ``-f``, a flag given on the command line
overrides the file's value for every execution group; one not given leaves the file's.
"""

from __future__ import annotations

import argparse
from dataclasses import fields, replace
from typing import Any

from interlock.cli.flags import Flags
from interlock.cluster.spec import ClusterSpec, ProcessOptions
from interlock.deploy import (
    ControlPlane,
    Deployment,
    ExecutionGroup,
    NodeGroup,
    Routing,
    load_deployment,
    validate_deployment,
)
from interlock.engine.vllm.args import normalize, parse_engine_arg
from interlock.errors import ConfigError
from interlock.frontend.config import FrontendConfig
from interlock.names import DTYPES, ENGINES, KV_INDEX_MODES, POLICIES, RUNNERS, TRANSPORTS, policy_name

_G, _N, _R, _C = ExecutionGroup(), NodeGroup(), Routing(), ControlPlane()


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """Flags of an execution group and its node groups (``deploy.ExecutionGroup``/``NodeGroup``)."""
    g = p.add_argument_group("engine")
    _add_model_args(g)
    _add_kv_cache_args(g)
    _add_kv_tier_args(g)
    _add_batching_args(g)
    _add_parallel_args(g)
    _add_step_args(g)
    _add_disagg_args(g)


def _add_model_args(g: Flags) -> None:
    """What each worker runs: the model, the engine and its runner."""
    g.add_argument("--model", default=None, help=f"model name, HF folder or GGUF file (default: {_G.model})")
    g.add_argument("--served-model-name", default=None, help="name clients use (default: the model folder's)")
    g.add_argument(
        "--engine",
        choices=ENGINES,
        default=None,
        help=f"engine each worker runs (default: {_G.engine}; vllm: vLLM's engine, docs/vllm.md)",
    )
    add_vllm_args(g)
    g.add_argument("--runner", choices=RUNNERS, default=None, help=f"model runner (default: {_G.runner})")
    g.add_argument(
        "--device", default=None, help="cpu, cuda (workers spread over the devices) or cuda:N (default: cpu)"
    )
    add_dtype_arg(g)


def add_vllm_args(g: Flags) -> None:
    """``--engine-arg``: vLLM's own engine arguments, passed through (``serve``, ``worker``, ``profile``)."""
    g.add_argument(
        "--engine-arg",
        dest="engine_arg",
        action="append",
        default=None,
        metavar="KEY=VALUE",
        help="with --engine vllm: one of vLLM's engine arguments, as vLLM names it "
        "(--engine-arg enforce_eager=true; repeat for more; values parse as JSON when they can)",
    )


def add_dtype_arg(g: Flags) -> None:
    """``--dtype`` of the model (``serve``, ``worker``, ``profile``)."""
    g.add_argument(
        "--dtype",
        choices=DTYPES,
        default=None,
        help=f"model dtype (default: {_G.dtype}: bf16 where this machine computes it fast, else fp32)",
    )


def _add_kv_cache_args(g: Flags) -> None:
    """The device KV cache: block size and how many blocks."""
    g.add_argument(
        "--block-size",
        type=int,
        default=None,
        help="tokens per KV block (default: 16; 32 for vLLM on a CPU, a multiple of 32 there)",
    )
    g.add_argument(
        "--num-blocks", type=int, default=None, help="KV blocks per worker (default: from --kv-cache-gib)"
    )
    g.add_argument(
        "--kv-cache-gib",
        type=float,
        default=None,
        help=f"KV cache per worker, GiB (default: {_N.kv_cache_gib})",
    )


def _add_kv_tier_args(g: Flags) -> None:
    """The KV tiers below the device (host memory, disk) and sharing the cache on one host."""
    g.add_argument(
        "--host-kv-gib",
        type=float,
        default=None,
        help="host-memory KV tier per worker, GiB (default: 0, none)",
    )
    g.add_argument(
        "--host-kv-shared",
        default=None,
        metavar="NAME",
        help="share the host KV tier with this host's workers of the same NAME (a /dev/shm segment)",
    )
    g.add_argument(
        "--disk-kv-gib", type=float, default=None, help="disk KV tier per worker, GiB (default: 0, none)"
    )
    g.add_argument("--disk-kv-path", default=None, help="directory of the disk KV tier")
    g.add_argument(
        "--tier-load-timeout",
        type=float,
        default=None,
        help="seconds a load from the host or disk KV tier may take, plus its bytes at "
        "--tier-load-min-mib-s, before it is abandoned and the request computes those blocks "
        f"(a hung or dying disk) (default: {_N.tier_load_timeout_s:g})",
    )
    g.add_argument(
        "--tier-load-min-mib-s",
        type=float,
        default=None,
        help="slowest read rate, MiB/s, a working KV tier is allowed when that deadline is sized "
        f"(default: {_N.tier_load_min_mib_s:g})",
    )
    g.add_argument(
        "--shared-kv-cache",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="KV cache on a memfd, so a decode worker of this host copies a prefill's blocks "
        "straight out of it (default: on for CPU prefill workers, and role both without KV tiers)",
    )


def _add_batching_args(g: Flags) -> None:
    """How much one engine step takes on, and prefix reuse."""
    g.add_argument(
        "--max-num-seqs",
        type=int,
        default=None,
        help=f"requests a worker runs at once (default: {_N.max_num_seqs})",
    )
    g.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        help=f"tokens per engine step (default: {_N.max_num_batched_tokens})",
    )
    g.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="longest prompt + output (default: the model's own context length)",
    )
    g.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="reuse KV of shared prompt prefixes (default: on)",
    )
    g.add_argument(
        "--no-prefix-caching",
        dest="enable_prefix_caching",
        action="store_false",
        default=None,
        help="same as --no-enable-prefix-caching",
    )


def _add_parallel_args(g: Flags) -> None:
    g.add_argument(
        "--tensor-parallel-size",
        "-tp",
        type=int,
        default=None,
        help="tensor-parallel ranks per worker: each layer's heads and MLP features split over "
        "that many processes (devices on CUDA); default 1",
    )
    g.add_argument(
        "--pipeline-parallel-size",
        "-pp",
        type=int,
        default=None,
        help="pipeline stages per worker: the layers split over that many processes, steps in "
        "micro-batches; default 1",
    )
    g.add_argument(
        "--offload-after",
        type=float,
        default=None,
        metavar="SECONDS",
        help="drop a worker's weights after this long without a request; the next request "
        "loads them again (default 0: they stay)",
    )


def _add_step_args(g: Flags) -> None:
    """Preemption, the step's speed (threads, the mock's speed-up) and when a worker counts busy."""
    g.add_argument(
        "--preempt-enabled",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a more important waiting request (lower priority) may preempt a less "
        "important running one (default: off; serve -f: routing.preempt_enabled)",
    )
    g.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads per worker (default: the cores shared among the workers)",
    )
    g.add_argument("--speedup", type=float, default=None, help="mock runner: divide model time by this")
    g.add_argument(
        "--queue-depth-threshold",
        type=int,
        default=None,
        help="routers count a worker busy while more requests wait in its queue "
        f"(default: {_N.queue_depth_threshold})",
    )


def _add_disagg_args(g: Flags) -> None:
    """KV transfer between workers, which disaggregated prefill needs."""
    g.add_argument(
        "--kv-cache-transfer",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run a KV transfer agent (needed to disaggregate; default: on)",
    )
    g.add_argument(
        "--cache-transport",
        choices=TRANSPORTS,
        default=None,
        help="how KV is pulled from a peer: auto picks per peer (default: auto)",
    )
    g.add_argument(
        "--kv-transfer",
        choices=(*TRANSPORTS, "none"),
        default=None,
        help="older form: none is --no-kv-cache-transfer, else --cache-transport",
    )


def add_listen_args(p: argparse.ArgumentParser) -> None:
    """Where the HTTP frontend listens (``serve``, ``frontend``): ``control_plane.listen_*``."""
    p.add_argument("--host", default=None, help="interface the HTTP frontend listens on (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="HTTP port (default: 8000)")
    p.add_argument(
        "--frontend-workers",
        "--api-server-count",
        dest="frontend_workers",
        type=int,
        default=None,
        help="frontend processes serving the port together, to use more cores (default: 1)",
    )


def add_plane_args(p: argparse.ArgumentParser, *, nats_default: str | None = None) -> None:
    g = p.add_argument_group("control plane")
    g.add_argument(
        "--nats-url",
        default=nats_default,
        help="NATS server of the deployment (serve: start a private one when not given)",
    )
    g.add_argument(
        "--heartbeat-interval",
        type=float,
        default=None,
        help=f"seconds between lease renewals (default: {_C.heartbeat_interval})",
    )
    g.add_argument(
        "--heartbeat-timeout",
        type=float,
        default=None,
        help="seconds of silence after which a process leaves discovery (default: five heartbeat intervals)",
    )


def add_routing_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("routing")
    g.add_argument(
        "--policy",
        "--router-mode",
        dest="policy",
        default=None,
        type=policy_name,
        help=f"base routing policy: {', '.join(POLICIES)} (default: {_R.policy})",
    )
    g.add_argument(
        "--route-key-header",
        default=None,
        help="header whose value picks a consistent subset of workers (default: x-route-key)",
    )
    g.add_argument(
        "--kv-index",
        choices=KV_INDEX_MODES,
        default=None,
        help="local: keep the fleet's KV index here (every KV event is ingested); remote: keep none "
        "and ask a frontend that keeps one, per request (default: local)",
    )
    g.add_argument(
        "--kv-shard",
        default=None,
        metavar="I/N",
        help="keep only shard I of N of the KV index (its workers' events) and route by asking "
        "every shard per request (docs/scale.md)",
    )
    g.add_argument(
        "--enforce-disagg",
        action="store_true",
        help="prefill every request on a prefill worker (waiting in the queue while all are busy); "
        "503 when one cannot be",
    )
    add_dispatch_args(p)


def add_dispatch_args(p: argparse.ArgumentParser) -> None:
    """Flags of the router's dispatcher (migration, stall timeouts): ``routing.migration_limit``
    and ``routing.stall_timeout_s`` of the deployment file, which a flag given overrides."""
    p.add_argument(
        "--migration-limit",
        type=int,
        default=None,
        help="times a request whose worker fails mid-stream moves to another worker "
        f"(0: off; the client gets the error) (default: {_R.migration_limit})",
    )
    p.add_argument(
        "--stall-timeout",
        type=float,
        default=None,
        help="seconds without a token (once the first is out) after which a stream "
        f"counts as stalled and migrates; raised on workers with slow steps (default: {_R.stall_timeout_s:g})",
    )


def add_process_args(p: argparse.ArgumentParser) -> None:
    d = ProcessOptions()
    p.add_argument(
        "--drain-grace",
        type=float,
        default=d.drain_grace_s,
        help="seconds a stopping worker gets to finish what it is running",
    )
    p.add_argument(
        "--kv-transfer-timeout",
        type=float,
        default=d.kv_transfer_timeout_s,
        help="seconds a staged KV payload waits to be pulled (and a pull may take)",
    )


def _given(a: argparse.Namespace, mapping: dict[str, str], cls: type) -> dict[str, Any]:
    """The fields of ``cls`` that flags set: {field: value} for each flag given."""
    names = {f.name for f in fields(cls)}
    out = {}
    for flag, field_name in mapping.items():
        value = getattr(a, flag, None)
        if value is not None:
            assert field_name in names, field_name
            out[field_name] = value
    return out


_GROUP_FLAGS = {
    "model": "model",
    "served_model_name": "served_model_name",
    "engine": "engine",
    "runner": "runner",
    "device": "device",
    "dtype": "dtype",
    "block_size": "block_size",
    "max_model_len": "max_model_len",
    "enable_prefix_caching": "enable_prefix_caching",
    "threads": "threads",
    "speedup": "speedup",
    "tensor_parallel_size": "tensor_parallel_size",
    "pipeline_parallel_size": "pipeline_parallel_size",
    "offload_after": "offload_after_s",
}
_NODE_FLAGS = {
    "num_blocks": "num_blocks",
    "kv_cache_gib": "kv_cache_gib",
    "max_num_seqs": "max_num_seqs",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "queue_depth_threshold": "queue_depth_threshold",
    "kv_cache_transfer": "kv_cache_transfer",
    "cache_transport": "cache_transport",
    "host_kv_gib": "host_kv_gib",
    "host_kv_shared": "host_kv_shared",
    "disk_kv_gib": "disk_kv_gib",
    "disk_kv_path": "disk_kv_path",
    "tier_load_timeout": "tier_load_timeout_s",
    "tier_load_min_mib_s": "tier_load_min_mib_s",
    "shared_kv_cache": "shared_kv_cache",
}
_PLANE_FLAGS = {
    "host": "listen_host",
    "port": "listen_port",
    "frontend_workers": "frontend_workers",
    "nats_url": "nats_url",
    "heartbeat_interval": "heartbeat_interval",
    "heartbeat_timeout": "heartbeat_timeout",
}
_ROUTING_FLAGS = {
    "policy": "policy",
    "route_key_header": "route_key",
    "preempt_enabled": "preempt_enabled",
    "migration_limit": "migration_limit",
    "stall_timeout": "stall_timeout_s",
    "kv_index": "kv_index",
    "kv_shard": "kv_shard",
}


def deployment_from_args(
    a: argparse.Namespace, *, read_by: tuple[str, ...] = (), nodes: tuple[NodeGroup, ...] | None = None
) -> Deployment:
    """The deployment the flags describe: ``-f FILE`` (when the command has it) with the given
    flags applied on top, or the defaults with ``nodes`` (when given) and the flags.

    ``read_by``: the file's sections this command reads itself (``serve``: ``PLANNER_SECTION``),
    which ``load_deployment`` would otherwise refuse."""
    file = getattr(a, "file", None)
    d = load_deployment(file, read_by=read_by) if file else Deployment()
    if nodes is not None:
        d = replace(d, execution_groups=tuple(replace(g, nodes=nodes) for g in d.execution_groups))
    legacy = getattr(a, "kv_transfer", None)
    node_changes = _given(a, _NODE_FLAGS, NodeGroup)
    if legacy is not None:
        node_changes.setdefault("kv_cache_transfer", legacy != "none")
        if legacy != "none":
            node_changes.setdefault("cache_transport", legacy)
    group_changes = _given(a, _GROUP_FLAGS, ExecutionGroup)
    if getattr(a, "engine_arg", None):
        group_changes["engine_args"] = normalize(parse_engine_arg(item) for item in a.engine_arg)
    groups = tuple(
        replace(g, **group_changes, nodes=tuple(replace(n, **node_changes) for n in g.nodes))
        for g in d.execution_groups
    )
    routing = replace(d.routing, **_given(a, _ROUTING_FLAGS, Routing))
    if getattr(a, "enforce_disagg", False):
        routing = replace(routing, enforce_disagg=True)
    cp = replace(d.control_plane, **_given(a, _PLANE_FLAGS, ControlPlane))
    d = replace(d, control_plane=cp, execution_groups=groups, routing=routing)
    validate_deployment(d)
    return d


def process_options(a: argparse.Namespace, **command_flags: Any) -> ProcessOptions:
    """The process handling ``add_process_args`` gives, with ``command_flags`` (the
    ``ProcessOptions`` fields that only the calling command has flags for)."""
    return ProcessOptions(
        drain_grace_s=a.drain_grace, kv_transfer_timeout_s=a.kv_transfer_timeout, **command_flags
    )


def cluster_spec(
    a: argparse.Namespace,
    d: Deployment,
    *,
    frontend: FrontendConfig | None,
    processes: ProcessOptions,
    **changes: Any,
) -> ClusterSpec:
    """The builder's input for a command: the deployment, the command's ``frontend`` (None:
    no HTTP server) and ``processes``, and the secrets every command reads from its flags."""
    from interlock.cli.security import cluster_secret, nats_auth

    return ClusterSpec(
        deployment=d,
        frontend=frontend,
        processes=processes,
        cluster_secret=cluster_secret(a),
        nats_auth=nats_auth(a),
        **changes,
    )


def refuse_with_file(a: argparse.Namespace, *flags: str) -> None:
    """Flags that a deployment file replaces: giving both is an error, not a silent choice."""
    for flag in flags:
        if getattr(a, flag.lstrip("-").replace("-", "_"), None) is not None:
            raise ConfigError(f"{flag}: not used with -f (the file's node groups say how many workers)")
