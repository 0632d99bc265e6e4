"""The planner's configuration: typed, frozen, validated once (the deployment file's
``planner:`` section and the ``--planner*`` flags fill it).

Every key changes behaviour; unknown keys are refused by name (``parse_planner_config``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from interlock.errors import ConfigError
from interlock.protocol.discovery import ROLES

PLANNER_POLICIES = ("reactive", "sla")


@dataclass(frozen=True)
class RoleBounds:
    """How many workers of one role the planner keeps (it never goes outside them, and moves a
    fleet that is outside back in, one step at a time)."""

    min: int = 0
    max: int = 0

    def __post_init__(self) -> None:
        if self.min < 0 or self.max < self.min:
            raise ConfigError(f"role bounds need 0 <= min <= max, got min={self.min} max={self.max}")


@dataclass(frozen=True)
class PlannerConfig:
    policy: str = "reactive"
    """"reactive": queue depth and KV usage with hysteresis; "sla": pools sized from TTFT/ITL
    targets, a forecast of arrivals, and a measured capability profile."""
    both: RoleBounds = RoleBounds(1, 8)
    prefill: RoleBounds = RoleBounds(0, 0)
    decode: RoleBounds = RoleBounds(0, 0)
    max_workers: int = 0
    """Cap on all workers together (0: the sum of the role maxima). Role switches keep the
    fleet's size, so a full fleet still follows the mix."""
    min_workers: int = 0
    """Floor on all workers together: the planner removes none below it (it may still switch
    roles). With ``min_workers == max_workers`` the fleet keeps its size and only roles move."""
    interval_s: float = 5.0
    """How often the loop observes the fleet."""
    window_s: float = 60.0
    """After a change, observe this long before deciding again (one step per window)."""
    grow_window_s: float = 0.0
    """After an add, a further add may come this soon (0: half of ``window_s``); any other
    change still waits ``window_s``. A new worker's effect shows once it has started (decisions
    wait for that anyway), while under a surge or a day's rise every window waited costs the
    queued requests (one step per 60 s window left a 20-worker fleet 10 short of a rise)."""
    shrink_window_s: float = 0.0
    """After a removal, a further removal may come this soon (0: half of ``window_s``); any
    other change still waits ``window_s``. A descent moves in the direction the last step took,
    and each removal is already backed by the policy's evidence (the SLA policy: the forecast fits
    in fewer with ``headroom`` and the last window met the targets with arrivals not rising;
    the reactive policy: a whole window at the current size with every signal low); a whole
    window per step left the peak's fleet in place for minutes after the load fell. Turning
    round (an add after a removal) keeps the whole window: that is where flapping starts."""
    step_share: float = 0.1
    """One step moves at most this share of a pool (at least one worker), when the policy
    asks for several (the SLA policy: its shortfall, or the workers its forecast can spare);
    0: one worker per step. One worker per window is a step of half the pool at 2 workers and
    of 1% at 100: a share keeps what a step changes (cold caches added, caches lost, the
    traffic moved) the same part of the fleet at any size, and lets a large fleet follow a
    day's rise and descent that one worker per window cannot."""
    surge: float = 1.5
    """SLA: arrivals of the last 10 s at least this many times their smoothed level (with the
    pool two or more workers short of them) are a surge, served with the whole shortfall in
    one decision (``planner.sla``); 0: no surges, every add one step."""
    zero_after_s: float = 300.0
    """A pool whose ``min`` is 0 stops its last workers after this long with nothing to do (no
    arrivals, nothing in flight, nothing queued); a request arriving at the empty pool waits in
    the router's queue while the planner starts one (at once, past every hold). A policy alone
    never takes a pool below one worker."""
    max_changes: int = 0
    """At most this many changes in any ``cap_window_s`` (each worker added, removed or
    switched is one); 0: ``max(6, the fleet's maximum)``, so the cap lets the fleet turn over
    once per ``cap_window_s`` whatever its size (a fixed 6 stopped a 20-worker fleet's rise at
    10). The cap is a safety net against churn; the windows and ``step_share`` pace a day."""
    cap_window_s: float = 600.0
    queue_high: float = 2.0
    """Reactive: waiting requests per worker above which the pool grows."""
    queue_low: float = 0.2
    """Reactive: the pool may shrink only at or below this (hysteresis band: low..high)."""
    backlog_high_s: float = 2.0
    """Reactive: seconds of queued prefill per worker above which the pool grows."""
    backlog_low_s: float = 0.25
    """Reactive: the pool may shrink only at or below this."""
    kv_high: float = 0.85
    """Reactive: mean KV usage above which the pool grows."""
    kv_low: float = 0.5
    """Reactive: the pool may shrink only below this."""
    ttft_ms: float = 2000.0
    """SLA: time-to-first-token target."""
    itl_ms: float = 50.0
    """Inter-token latency target. SLA: the pools are sized for it; reactive: the pool that
    decodes grows while its inter-token time (decode step, observed ITL) is over it."""
    itl_low: float = 0.5
    """Reactive: the pool that decodes may shrink only while its inter-token time is at or
    under this fraction of ``itl_ms`` (hysteresis band: ``itl_low * itl_ms .. itl_ms``)."""
    attainment: float = 0.99
    """SLA: the share of requests the pools are sized to serve within the TTFT target."""
    slo_feedback: bool = True
    """SLA: what is observed corrects the model: when the requests observed finishing miss the
    targets more often than ``1 - attainment``, size the pools up by a correction factor (up to
    2x) until they do not; and the capacity model's error, measured window by window
    (``planner.calibration``), multiplies its needs. False: the model's needs as they are."""
    tail: bool = False
    """SLA: size an aggregated pool by replaying the recent requests against candidate sizes
    (``planner.tail``: bursts and heavy-tailed prompts, which means do not see) when the
    connector reports them one by one; false: from means alone. Experimental: its ITL part
    predicts 1.5-2x the misses the replay simulator shows and sizes the fleet up (BENCHMARKS,
    Planner), hence off by default."""
    horizon_s: float = 120.0
    """SLA: how far ahead arrivals are forecast."""
    headroom: float = 0.2
    """SLA: the pool shrinks only when it would still fit the forecast with this much spare
    (hysteresis: grow at need > n, shrink at need * (1 + headroom) <= n - 1)."""
    ramp_s: float = 0.0
    """A new worker's routing weight rises linearly from ``ramp_floor`` to 1 over this long
    (0, the default: full weight at once). The kv router already prices a new worker's empty
    cache; a ramp on top kept the workers a planner added nearly idle while the warm ones
    queued (over the planner's 24 load shapes, 60 s against 0: 7% more worker-seconds for the
    reactive policy and lower attainment for both; BENCHMARKS, planner on untuned traffic).
    For least-loaded or power-of-two routing, which do not see caches, a ramp keeps a new worker
    from taking every request until its load matches the others'."""
    ramp_floor: float = 0.1
    cache_block_cost: float = 1.0 / 64
    """Scale-down: what losing one cached block nobody else holds costs, in in-flight requests."""
    profile: str | None = None
    """SLA: path of the capability profile written by ``interlock profile`` (required)."""

    def __post_init__(self) -> None:
        if self.policy not in PLANNER_POLICIES:
            raise ConfigError(f"planner.policy: {self.policy!r} is not one of {PLANNER_POLICIES}")
        for name in (
            "interval_s",
            "window_s",
            "cap_window_s",
            "ttft_ms",
            "itl_ms",
            "horizon_s",
            "zero_after_s",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"planner.{name} must be positive")
        for name in (
            "ramp_s",
            "headroom",
            "cache_block_cost",
            "queue_low",
            "kv_low",
            "max_workers",
            "min_workers",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(f"planner.{name} must be >= 0")
        if not 0 <= self.grow_window_s <= self.window_s:
            raise ConfigError("planner needs 0 <= grow_window_s <= window_s (0: half of window_s)")
        if not 0 <= self.shrink_window_s <= self.window_s:
            raise ConfigError("planner needs 0 <= shrink_window_s <= window_s (0: half of window_s)")
        if not 0 <= self.step_share <= 1:
            raise ConfigError("planner.step_share must be in [0, 1]")
        if self.surge and self.surge <= 1:
            raise ConfigError(
                "planner.surge must be above 1 (arrivals that many times their level), or 0 (off)"
            )
        if self.max_changes < 0:
            raise ConfigError("planner.max_changes must be >= 0 (0: max(6, the fleet's maximum))")
        if not self.queue_low < self.queue_high:
            raise ConfigError("planner.queue_low must be below planner.queue_high (hysteresis)")
        if not 0 <= self.backlog_low_s < self.backlog_high_s:
            raise ConfigError("planner needs 0 <= backlog_low_s < backlog_high_s (hysteresis)")
        if not 0 < self.itl_low < 1:
            raise ConfigError("planner.itl_low must be in (0, 1) (a fraction of planner.itl_ms)")
        if not 0 <= self.kv_low < self.kv_high <= 1:
            raise ConfigError("planner needs 0 <= kv_low < kv_high <= 1 (hysteresis)")
        if not 0 < self.attainment < 1:
            raise ConfigError("planner.attainment must be in (0, 1)")
        if not 0 < self.ramp_floor <= 1:
            raise ConfigError("planner.ramp_floor must be in (0, 1]")
        if self.total_max() < 1:
            raise ConfigError("planner: every role's max is 0 (no worker allowed)")
        if self.min_workers > self.total_max():
            raise ConfigError("planner.min_workers is above the most workers the bounds allow")
        if self.policy == "sla" and self.profile is None:
            raise ConfigError("planner.policy 'sla' needs planner.profile (from `interlock profile`)")

    def add_window_s(self) -> float:
        """How long after an add a further add may come."""
        return self.grow_window_s or self.window_s / 2

    def remove_window_s(self) -> float:
        """How long after a removal a further removal may come."""
        return self.shrink_window_s or self.window_s / 2

    def change_cap(self) -> int:
        """Changes allowed in any ``cap_window_s``."""
        return self.max_changes or max(6, self.total_max())

    def bounds(self, role: str) -> RoleBounds:
        b: RoleBounds = getattr(self, role)
        return b

    def total_max(self) -> int:
        total = sum(self.bounds(r).max for r in ROLES)
        return min(total, self.max_workers) if self.max_workers else total


_BOOLS = {f.name for f in fields(PlannerConfig) if f.type == "bool"}
_FLOATS = {f.name for f in fields(PlannerConfig) if f.type == "float"}
_INTS = {f.name for f in fields(PlannerConfig) if f.type == "int"}


def parse_planner_config(
    raw: Mapping[str, Any] | None, *, where: str = "planner", base: PlannerConfig | None = None
) -> PlannerConfig:
    """The ``planner:`` section of a deployment file (a mapping) as a ``PlannerConfig``.
    Keys may use ``-`` or ``_``; roles take ``{min: N, max: M}``. Unknown keys are refused."""
    if raw is None:
        return base or PlannerConfig()
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {type(raw).__name__}")
    known = {f.name for f in fields(PlannerConfig)}
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        name = str(key).replace("-", "_")
        if name not in known:
            raise ConfigError(f"{where}.{key}: unknown key (known: {', '.join(sorted(known))})")
        kwargs[name] = _value(name, value, f"{where}.{key}")
    return replace(base or PlannerConfig(), **kwargs)


def _value(name: str, value: Any, where: str) -> Any:
    if name in ROLES:
        if not isinstance(value, Mapping) or set(value) - {"min", "max"}:
            raise ConfigError(f"{where}: expected {{min: N, max: M}}")
        lo, hi = value.get("min", 0), value.get("max", 0)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (lo, hi)):
            raise ConfigError(f"{where}: min and max must be integers")
        return RoleBounds(lo, hi)
    if name in _BOOLS:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
        return value
    if name in _FLOATS or name in _INTS:
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or (name in _INTS and not isinstance(value, int))
        ):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value) if name in _FLOATS else value
    if name == "profile":
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"{where}: expected a path")
        return value
    if not isinstance(value, str):
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    return value
