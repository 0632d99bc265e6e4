"""The placement optimizer: how to cut one model over a cluster's devices, and why.

``choose`` tries every layout of ``T`` tensor ranks by ``P`` pipeline stages that the devices
hold, each repeated as many times as they allow (the replicas), and keeps one:

1. a layout the model cannot be cut into is out, for the reason ``can_cut`` gives (the caller
   passes the engine's own rule, ``engine.model.partition.check_sizes``, so that there is one
   definition of it: this package may not import the engine);
2. a layout whose weights, headroom and one full-length sequence's KV do not fit a device is
   out (``parallel_cost.kv_budget``);
3. tensor parallelism across hosts is out while a layout within one host fits: its two
   all-reduces a layer would cross the slowest link;
4. the rest are ranked by the profile: ``high_throughput`` by the fleet's output tokens a
   second, then latency; ``low_latency`` by the mean request's latency alone (TTFT plus its
   output at the batch-1 ITL), then throughput; fewer ranks a replica break ties.

Then the prefill/decode split of the chosen replicas (``split``): a split adds no throughput in
this model (every aggregated replica already prefills and decodes at full batch), so it is kept
for ``low_latency`` where prefill would take a tenth or more of an aggregated replica's time
(each prefill chunk stretches the decode steps around it), in proportion to the two roles' work.

The user may pin the tensor size, the pipeline size or the replicas (``Pins``); only layouts
that agree are tried, and the plan says what was pinned. What the optimizer cannot see is in
``parallel_cost``'s note and docs/partitioning.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, get_args

from interlock.errors import ConfigError
from interlock.planner.parallel_cost import Estimate, estimate, kv_budget
from interlock.planner.parallel_shapes import Cluster, DeviceSpec, ModelShape, Workload

Profile = Literal["high_throughput", "low_latency"]
PROFILES: tuple[str, ...] = get_args(Profile)
CanCut = Callable[[int, int], str]
SPLIT_SHARE = 0.1
"""Prefill's share of an aggregated replica's time from which ``low_latency`` splits the roles."""


def any_cut(tensor: int, pipeline: int) -> str:
    """A ``can_cut`` that refuses nothing (a caller that has no partition rule)."""
    return ""


@dataclass(frozen=True, slots=True)
class Pins:
    """Sizes the user fixed; None: the optimizer's choice."""

    tensor: int | None = None
    pipeline: int | None = None
    replicas: int | None = None

    def allows(self, tensor: int, pipeline: int) -> bool:
        return self.tensor in (None, tensor) and self.pipeline in (None, pipeline)

    def named(self) -> tuple[str, ...]:
        return tuple(
            f"{k} {v}"
            for k, v in (("tensor", self.tensor), ("pipeline", self.pipeline), ("replicas", self.replicas))
            if v is not None
        )


@dataclass(frozen=True, slots=True)
class Alternative:
    """A layout considered and not chosen: its figures (None where it cannot run) and why not."""

    tensor: int
    pipeline: int
    replicas: int
    estimate: Estimate | None
    rejected: str


@dataclass(frozen=True, slots=True)
class Split:
    """How the replicas share the roles: ``prefill`` 0 means aggregated (each does both)."""

    prefill: int
    decode: int
    fleet_tokens_per_s: float
    """The fleet's output tokens a second with this split."""
    kv_transfer_s: float
    """A mean prompt's KV from a prefill replica to a decode one (0 when aggregated)."""
    why: str

    @property
    def aggregated(self) -> bool:
        return self.prefill == 0


@dataclass(frozen=True, slots=True)
class Plan:
    tensor: int
    pipeline: int
    replicas: int
    split: Split
    estimate: Estimate
    profile: str
    pinned: tuple[str, ...]
    """What the user fixed ("tensor 2"), empty when the optimizer chose everything."""
    explanation: tuple[str, ...]
    alternatives: tuple[Alternative, ...]
    """Every other layout tried, best first, each with why it lost."""


class NoPlan(ConfigError):
    """No layout fits; ``alternatives`` says why each was refused."""

    def __init__(self, message: str, alternatives: tuple[Alternative, ...]) -> None:
        super().__init__(message)
        self.alternatives = alternatives


def choose(
    shape: ModelShape,
    cluster: Cluster,
    *,
    profile: str = "high_throughput",
    workload: Workload = Workload(),
    can_cut: CanCut = any_cut,
    pins: Pins = Pins(),
) -> Plan:
    """The layout ``profile`` prefers (module note); NoPlan where none fits."""
    _check(cluster, profile, pins)
    runs, refused = _try_layouts(shape, cluster, workload, can_cut, pins)
    if not runs:
        raise NoPlan(f"{shape.name or 'the model'} fits no layout of {cluster.devices} devices", refused)
    runs, across = _keep_within_hosts(runs, cluster, pins)
    ranked = sorted(runs, key=lambda e: _key(e, profile))
    best = ranked[0]
    losers = tuple(
        Alternative(e.tensor, e.pipeline, e.replicas, e, _why_not(e, best, profile)) for e in ranked[1:]
    )
    return Plan(
        tensor=best.tensor,
        pipeline=best.pipeline,
        replicas=best.replicas,
        split=split(best, cluster, shape, workload, profile),
        estimate=best,
        profile=profile,
        pinned=pins.named(),
        explanation=_explain(best, ranked[1:], cluster, profile, pins),
        alternatives=losers + across + refused,
    )


def _check(cluster: Cluster, profile: str, pins: Pins) -> None:
    if profile not in PROFILES:
        raise ConfigError(f"optimization profile {profile!r} is not one of {', '.join(PROFILES)}")
    sizes = [v for v in (pins.tensor, pins.pipeline, pins.replicas) if v is not None]
    if any(v < 1 for v in sizes):
        raise ConfigError("pinned tensor, pipeline and replica counts must be >= 1")
    ranks = (pins.tensor or 1) * (pins.pipeline or 1) * (pins.replicas or 1)
    if ranks > cluster.devices:
        raise ConfigError(f"the pinned sizes need {ranks} devices, the cluster has {cluster.devices}")


def _try_layouts(
    shape: ModelShape, cluster: Cluster, workload: Workload, can_cut: CanCut, pins: Pins
) -> tuple[list[Estimate], tuple[Alternative, ...]]:
    """Every layout the pins allow: the estimates of those that run, and the refused ones."""
    runs: list[Estimate] = []
    refused: list[Alternative] = []
    for tensor in range(1, cluster.devices + 1):
        for pipeline in range(1, cluster.devices // tensor + 1):
            if not pins.allows(tensor, pipeline):
                continue
            replicas = min(pins.replicas or cluster.devices, cluster.groups(tensor * pipeline))
            if replicas < 1:
                continue
            why = can_cut(tensor, pipeline)
            why = f"cannot cut: {why}" if why else kv_budget(shape, cluster, tensor, pipeline)[1]
            if why:
                refused.append(Alternative(tensor, pipeline, replicas, None, why))
            else:
                runs.append(estimate(shape, cluster, tensor, pipeline, replicas, workload))
    return runs, tuple(refused)


def _keep_within_hosts(
    runs: list[Estimate], cluster: Cluster, pins: Pins
) -> tuple[list[Estimate], tuple[Alternative, ...]]:
    """Layouts whose tensor ranks stay in one host, when any fits (or the user pinned T)."""
    inside = [e for e in runs if e.tensor <= cluster.devices_per_host]
    if not inside or pins.tensor is not None:
        return runs, ()
    why = f"tensor parallel across hosts (T > {cluster.devices_per_host} devices a host): all-reduces on the inter-host link"
    return inside, tuple(
        Alternative(e.tensor, e.pipeline, e.replicas, e, why)
        for e in runs
        if e.tensor > cluster.devices_per_host
    )


def _key(e: Estimate, profile: str) -> tuple[float, float, int]:
    if profile == "low_latency":
        return (e.latency_s, -e.fleet_tokens_per_s, e.ranks)
    return (-e.fleet_tokens_per_s, e.latency_s, e.ranks)


def _why_not(e: Estimate, best: Estimate, profile: str) -> str:
    tps = f"{e.fleet_tokens_per_s:,.0f} against {best.fleet_tokens_per_s:,.0f} tokens/s"
    lat = f"{e.latency_s * 1e3:,.1f} against {best.latency_s * 1e3:,.1f} ms a request"
    if profile == "low_latency":
        first, second = f"slower: {lat}", f"as fast, less throughput: {tps}"
    else:
        first, second = f"less throughput: {tps}", f"as much throughput, slower: {lat}"
    key, top = _key(e, profile), _key(best, profile)
    if key[0] != top[0]:
        return first
    if key[1] != top[1]:
        return second
    return f"as good, with more ranks a replica ({e.ranks} against {best.ranks})"


def split(best: Estimate, cluster: Cluster, shape: ModelShape, workload: Workload, profile: str) -> Split:
    """The prefill/decode split of ``best``'s replicas (module note)."""
    share, n = best.prefill_share, best.replicas
    if n < 2:
        return Split(0, n, best.fleet_tokens_per_s, 0.0, "aggregated: one replica does both")
    if profile != "low_latency" or share < SPLIT_SHARE:
        why = (
            "aggregated: a split adds no throughput here (every replica prefills and decodes at full batch)"
            if profile != "low_latency"
            else f"aggregated: prefill takes {share:.0%} of a replica's time, too little to pay for a split"
        )
        return Split(0, n, best.fleet_tokens_per_s, 0.0, why)
    prefill = min(n - 1, max(1, round(n * share)))
    decode = n - prefill
    bandwidth, latency = cluster.link(cluster.devices)
    transfer = latency + workload.prompt_tokens * shape.kv_bytes_per_token / bandwidth
    requests = min(
        prefill * best.prefill_tokens_per_s / workload.prompt_tokens,
        decode * best.batch / best.step_s / workload.output_tokens,
    )
    why = (
        f"split: prefill takes {share:.0%} of an aggregated replica's time and would stretch its "
        f"decode steps by {share / (1 - share):.0%}; {prefill} prefill + {decode} decode replicas share "
        f"the work in proportion; a mean prompt's KV crosses in {transfer * 1e3:.1f} ms"
    )
    return Split(prefill, decode, requests * workload.output_tokens, transfer, why)


def _explain(
    best: Estimate,
    others: list[Estimate],
    cluster: Cluster,
    profile: str,
    pins: Pins,
) -> tuple[str, ...]:
    layout = f"{best.replicas} x (TP {best.tensor} x PP {best.pipeline})"
    lines = [f"pinned: {', '.join(pins.named())}"] if pins.named() else []
    if profile == "low_latency":
        lines.append(
            f"lowest latency for the mean request: {layout}, TTFT {best.ttft_s * 1e3:,.1f} ms + ITL "
            f"{best.itl_s * 1e3:,.2f} ms a token = {best.latency_s * 1e3:,.1f} ms"
        )
    else:
        lines.append(
            f"most output tokens/s over {cluster.devices} devices: {layout} give "
            f"{best.fleet_tokens_per_s:,.0f} tokens/s ({best.batch} sequences a replica, "
            f"KV for {best.kv_tokens:,} tokens)"
        )
    if others:
        o = others[0]
        lines.append(
            f"next best: {o.replicas} x (TP {o.tensor} x PP {o.pipeline}), {_why_not(o, best, profile)}"
        )
    if best.tensor > cluster.devices_per_host:
        why = "pinned" if pins.tensor else "no layout within one host fits"
        lines.append(f"tensor parallel crosses hosts ({why}): its all-reduces run on the inter-host link")
    return tuple(lines)


__all__ = [
    "PROFILES",
    "Alternative",
    "CanCut",
    "Cluster",
    "DeviceSpec",
    "Estimate",
    "ModelShape",
    "NoPlan",
    "Pins",
    "Plan",
    "Profile",
    "Split",
    "Workload",
    "any_cut",
    "choose",
    "split",
]
