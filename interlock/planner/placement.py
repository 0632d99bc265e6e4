"""Where one more worker fits: hosts offer cores, devices and memory, workers need them.

Pure values and functions, no I/O: the cluster builder detects or reads its hosts and derives
each worker's ``Needs`` from its spec; this module only adds up. The rule it keeps is the one
the planner relies on: a host never gets more than it has, less its headroom (cores and memory
kept free for the router, the frontend and the system), in any resource. Oversubscribing cores
does not give more throughput on a CPU engine: every worker on the host slows down (threads
contend, streams stall), so an add that does not fit is refused, never squeezed in.

Placement is *best fit*: among the hosts where the worker fits, the one left with the fewest
free cores (then devices, then memory) afterwards. It packs busy hosts first and keeps the
emptiest host whole for a larger worker later, the classic bin-packing rule that wastes least
when items arrive one at a time; ties go to the host listed first, so placement is
deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

GIB = 1 << 30
_EPS = 1e-9
"""Fractional cores (a mock worker's quarter) add up with rounding error: within this, it fits."""


@dataclass(frozen=True, slots=True)
class Needs:
    """What one worker takes from its host while it runs."""

    cores: float
    """CPU cores its threads keep busy (a CPU engine: its thread count)."""
    devices: int = 0
    """Accelerators it drives (tensor x pipeline parallel size)."""
    memory_bytes: int = 0
    """Host memory: weights, KV cache and tiers, the process itself."""

    def __post_init__(self) -> None:
        if not (self.cores > 0 and math.isfinite(self.cores)):
            raise ValueError(f"a worker needs a positive, finite number of cores, got {self.cores}")
        if self.devices < 0 or self.memory_bytes < 0:
            raise ValueError("a worker's devices and memory must be >= 0")


@dataclass(frozen=True, slots=True)
class Host:
    """What one machine offers its workers."""

    name: str
    cores: float
    devices: int = 0
    memory_bytes: int | None = None
    """None: not known (memory is then not a limit)."""


@dataclass(frozen=True, slots=True)
class Headroom:
    """Kept free on every host, whatever the workers need."""

    cores: float = 0.0
    memory_bytes: int = 0

    def __post_init__(self) -> None:
        if self.cores < 0 or self.memory_bytes < 0:
            raise ValueError("headroom must be >= 0")


@dataclass(frozen=True, slots=True)
class Placed:
    """A worker already on ``host``."""

    host: str
    needs: Needs


def used(host: Host, placed: Sequence[Placed]) -> tuple[float, int, int]:
    """Cores, devices and memory the workers placed on ``host`` take."""
    on = [p.needs for p in placed if p.host == host.name]
    return sum(n.cores for n in on), sum(n.devices for n in on), sum(n.memory_bytes for n in on)


def fits_count(host: Host, placed: Sequence[Placed], needs: Needs, headroom: Headroom) -> tuple[int, str]:
    """How many more workers of ``needs`` fit on ``host``, and the resource that binds first,
    as a line (``"host a: 2.0 of 2 cores used, 0.0 headroom"``)."""
    cores, devices, memory = used(host, placed)
    limits: list[tuple[float, str]] = [
        (
            _count(host.cores - headroom.cores - cores, needs.cores),
            f"{cores:.1f} of {host.cores:g} cores used, {headroom.cores:.1f} headroom",
        )
    ]
    if needs.devices:
        limits.append(
            (_count(host.devices - devices, needs.devices), f"{devices} of {host.devices} devices used")
        )
    if needs.memory_bytes and host.memory_bytes is not None:
        limits.append(
            (
                _count(host.memory_bytes - headroom.memory_bytes - memory, needs.memory_bytes),
                f"{memory / GIB:.1f} of {host.memory_bytes / GIB:.1f} GiB memory used, "
                f"{headroom.memory_bytes / GIB:.1f} GiB headroom",
            )
        )
    n, why = min(limits, key=lambda lim: lim[0])
    return int(n), f"host {host.name}: {why}"


def _count(free: float, need: float) -> float:
    return max(0, math.floor((free + _EPS) / need))


def place(hosts: Sequence[Host], placed: Sequence[Placed], needs: Needs, headroom: Headroom) -> Host | None:
    """The host one more worker of ``needs`` goes to (best fit, module docstring); None: it
    fits nowhere (``room`` says why)."""
    best: tuple[tuple[float, int, int], Host] | None = None
    for host in hosts:
        if fits_count(host, placed, needs, headroom)[0] < 1:
            continue
        cores, devices, memory = used(host, placed)
        left = (
            host.cores - cores - needs.cores,
            host.devices - devices - needs.devices,
            (host.memory_bytes or 0) - memory - needs.memory_bytes,
        )
        if best is None or left < best[0]:
            best = (left, host)
    return None if best is None else best[1]


def room(
    hosts: Sequence[Host], placed: Sequence[Placed], needs: Needs, headroom: Headroom
) -> tuple[int, str]:
    """How many more workers of ``needs`` the hosts can take (placed one at a time: workers
    of equal needs fill each host independently, so the sum over hosts is exact), and why no
    more: the binding resource of each host, ``"; "``-joined."""
    counts = [fits_count(h, placed, needs, headroom) for h in hosts]
    if not counts:
        return 0, "no host to place workers on"
    return sum(n for n, _ in counts), "; ".join(why for _, why in counts)


__all__ = ["GIB", "Headroom", "Host", "Needs", "Placed", "fits_count", "place", "room", "used"]
