"""Time-varying load from a real trace: multiply its arrival rate by a curve.

A trace keeps its requests, their order and their lengths; only arrival times move. With a
rate multiplier ``m(t)`` (in the new time), an original arrival at ``s`` moves to the ``t``
where ``integral_0^t m = s``: where ``m`` is 3 the requests come three times as fast. Curves:

* ``steps:600x1,600x3,600x1``: 600 s at x1, 600 s at x3, then x1 (the last step lasts);
* ``diurnal:period=3600,min=0.5,max=2``: ``min + (max - min) (1 - cos(2 pi t / period)) / 2``,
  starting at the trough;
* ``ramp:from=1,to=4,over=1200,after=300``: ``from`` until ``after``, then linear to ``to`` over
  ``over`` seconds, then ``to`` (down as well as up);
* ``spike:base=1,peak=3,at=600,width=60``: ``base``, and ``peak`` for ``width`` seconds from ``at``;
* ``flash:base=1,peak=6,at=600,rise=10,decay=300``: a flash crowd: ``base``, then from ``at`` up to
  ``peak`` in ``rise`` seconds, then back towards ``base`` exponentially (time constant ``decay``);
* a name of ``FAMILY``, the load shapes the planner is measured on (steps up and down x2-x4,
  spikes, ramps, shallow and deep days, flash crowds).

``tile`` makes a trace longer, so a curve can rise over a longer time than the trace spans at
its own speed: copies one after another, each with its block hashes salted (a copy shares no
cache with another: a new day's conversations, not the same ones again).

``overlay`` makes a trace denser the way a larger deployment is: more independent users, not
the same users faster. Copies share the span, each salted and rotated by its share of the span
(copy ``i`` of ``k`` starts ``i / k`` of the way in and wraps around), so one copy's bursts and
long prompts do not coincide with another's; within a copy every request keeps its
predecessors (conversations cut by the wrap lose a few hits), so the hit ratio stays about the
trace's while the rate is ``k`` times as high.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from interlock.errors import ConfigError
from interlock.sim.trace import SimRequest

RateCurve = Callable[[float], float]

_GRID_S = 0.25


def steps(segments: Sequence[tuple[float, float]]) -> RateCurve:
    """``(duration_s, multiplier)`` pieces; the last one lasts for ever."""
    if not segments or any(d <= 0 or m <= 0 for d, m in segments):
        raise ConfigError("rate steps need positive durations and multipliers")
    ends = np.cumsum([d for d, _ in segments])

    def m(t: float) -> float:
        i = int(np.searchsorted(ends, t, side="right"))
        return segments[min(i, len(segments) - 1)][1]

    return m


def diurnal(period_s: float, lo: float, hi: float) -> RateCurve:
    if period_s <= 0 or lo <= 0 or hi < lo:
        raise ConfigError("a diurnal curve needs period > 0 and 0 < min <= max")
    return lambda t: lo + (hi - lo) * (1.0 - math.cos(2 * math.pi * t / period_s)) / 2.0


def ramp(start: float, end: float, over_s: float, after_s: float = 0.0) -> RateCurve:
    if start <= 0 or end <= 0 or over_s <= 0 or after_s < 0:
        raise ConfigError("rate curve: a ramp needs positive from, to and over, and after >= 0")
    return lambda t: start + (end - start) * min(max((t - after_s) / over_s, 0.0), 1.0)


def spike(base: float, peak: float, at_s: float, width_s: float) -> RateCurve:
    if base <= 0 or peak <= 0 or at_s < 0 or width_s <= 0:
        raise ConfigError("rate curve: a spike needs positive base, peak and width, and at >= 0")
    return lambda t: peak if at_s <= t < at_s + width_s else base


def flash(base: float, peak: float, at_s: float, rise_s: float, decay_s: float) -> RateCurve:
    if base <= 0 or peak < base or at_s < 0 or rise_s <= 0 or decay_s <= 0:
        raise ConfigError("rate curve: a flash crowd needs 0 < base <= peak, rise and decay > 0, at >= 0")

    def m(t: float) -> float:
        if t < at_s:
            return base
        if t < at_s + rise_s:
            return base + (peak - base) * (t - at_s) / rise_s
        return base + (peak - base) * math.exp(-(t - at_s - rise_s) / decay_s)

    return m


FAMILY: dict[str, str] = {
    "step-x2": "steps:600x1,600x2,600x1",
    "step-x3": "steps:600x1,600x3,600x1",
    "step-x4": "steps:600x1,600x4,600x1",
    "step-down-x2": "steps:600x2,600x1,600x2",
    "step-down-x4": "steps:600x4,600x1,600x4",
    "spike-x3": "spike:base=1,peak=3,at=600,width=60",
    "spike-x4-short": "spike:base=1,peak=4,at=600,width=20",
    "ramp-up-x4": "ramp:from=1,to=4,over=1200,after=300",
    "ramp-down-x4": "ramp:from=4,to=1,over=1200,after=300",
    "day-shallow": "diurnal:period=1800,min=0.7,max=1.3",
    "day-deep": "diurnal:period=1800,min=0.25,max=2",
    "flash-x6": "flash:base=1,peak=6,at=600,rise=10,decay=300",
}
"""The load shapes the planner is measured on (issue 29), by name; each applies to any trace."""

_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "diurnal": (("period", "min", "max"), ()),
    "ramp": (("from", "to", "over"), ("after",)),
    "spike": (("base", "peak", "at", "width"), ()),
    "flash": (("base", "peak", "at", "rise", "decay"), ()),
}
"""Each keyed curve's keys: the ones it needs, then the optional ones."""


def parse_curve(spec: str) -> RateCurve:
    """A curve as the module docstring writes it, or a ``FAMILY`` name."""
    spec = FAMILY.get(spec, spec)
    kind, _, body = spec.partition(":")
    try:
        if kind == "steps":
            pieces = [p.split("x") for p in body.split(",")]
            return steps([(float(d), float(m)) for d, m in pieces])
        if kind in _KEYS:
            needed, optional = _KEYS[kind]
            kv = {k: float(v) for k, v in (p.split("=") for p in body.split(","))}
            if set(kv) - {*needed, *optional} or set(needed) - set(kv):
                keys = ", ".join(needed) + (f" (and optionally {', '.join(optional)})" if optional else "")
                raise ConfigError(f"rate curve {spec!r}: {kind} takes {keys}")
            if kind == "diurnal":
                return diurnal(kv["period"], kv["min"], kv["max"])
            if kind == "ramp":
                return ramp(kv["from"], kv["to"], kv["over"], kv.get("after", 0.0))
            if kind == "spike":
                return spike(kv["base"], kv["peak"], kv["at"], kv["width"])
            return flash(kv["base"], kv["peak"], kv["at"], kv["rise"], kv["decay"])
    except ValueError:
        raise ConfigError(f"rate curve {spec!r}: cannot read it (see `interlock replay -h`)") from None
    kinds = ", ".join(("steps", *_KEYS))
    raise ConfigError(
        f"rate curve {spec!r}: expected one of {kinds} (kind:...), or a name of {sorted(FAMILY)}"
    )


def tile(requests: Sequence[SimRequest], copies: int) -> list[SimRequest]:
    """``copies`` of the trace back to back (copy ``i`` starts ``i`` spans later; a span is the
    last arrival plus the mean gap), request and session ids suffixed ``#i``, block hashes
    xor-ed with a per-copy salt (the same prefixes within a copy, none across copies)."""
    return _copies(requests, copies, "tile", lambda t, i, span: t + i * span)


def overlay(requests: Sequence[SimRequest], copies: int) -> list[SimRequest]:
    """``copies`` of the trace over its own span (module docstring): copy ``i`` shifted by
    ``i / copies`` of the span, arrivals past the span wrapped to its start, ids and block
    hashes as ``tile`` makes them. Sorted by arrival."""
    out = _copies(requests, copies, "overlay", lambda t, i, span: (t + i * span / copies) % span)
    return sorted(out, key=lambda r: r.arrival_s)


def _copies(
    requests: Sequence[SimRequest], copies: int, what: str, place: Callable[[float, int, float], float]
) -> list[SimRequest]:
    """The trace, then copies ``1..copies-1`` of it, copy ``i`` of a request arriving at
    ``place(arrival, i, span)``, its ids suffixed ``#i`` and its block hashes salted."""
    if copies < 1:
        raise ConfigError(f"{what} needs at least one copy")
    reqs = sorted(requests, key=lambda r: r.arrival_s)
    if any(r.token_ids is not None for r in reqs):
        raise ConfigError(f"{what}: requests with real tokens (the engine backend) cannot be salted")
    if copies == 1 or not reqs:
        return reqs
    span = reqs[-1].arrival_s + reqs[-1].arrival_s / max(len(reqs) - 1, 1)
    out = list(reqs)
    for i in range(1, copies):
        salt = (0x9E3779B97F4A7C15 * i) & 0xFFFF_FFFF_FFFF_FFFF
        out += [
            replace(
                r,
                request_id=f"{r.request_id}#{i}",
                arrival_s=place(r.arrival_s, i, span),
                block_hashes=tuple(h ^ salt for h in r.block_hashes),
                session_id=None if r.session_id is None else f"{r.session_id}#{i}",
            )
            for r in reqs
        ]
    return out


def warp(requests: Sequence[SimRequest], curve: RateCurve) -> list[SimRequest]:
    """The requests with arrivals moved so the rate follows ``curve`` (sorted by arrival)."""
    reqs = sorted(requests, key=lambda r: r.arrival_s)
    if not reqs:
        return []
    last = reqs[-1].arrival_s
    grid = [0.0]
    cum = [0.0]
    while cum[-1] <= last:
        t = grid[-1]
        cum.append(cum[-1] + _GRID_S * curve(t + _GRID_S / 2))
        grid.append(t + _GRID_S)
    new = np.interp([r.arrival_s for r in reqs], cum, grid)
    return [replace(r, arrival_s=float(t)) for r, t in zip(reqs, new, strict=True)]
