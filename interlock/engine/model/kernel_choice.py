"""Which kernel each linear layer uses, for each number of rows, chosen by measurement.

No CPU flag says which matmul is fastest for a given shape: on an AMD Zen with AVX-512 BF16 the
small-batch kernel (``cpu_ops.linear_small``) beat oneDNN at every size the engine meets, while
on an Intel Xeon with AMX oneDNN's tiles won a 512-token prefill 3-4x. So the first time a model
loads on a machine, every candidate is timed for every weight shape and a range of row counts
(decode batches, prefill chunks), and each range goes to the fastest. The table is cached by
machine (CPU model, flags, threads, torch, kernel source), so later starts read it; the choice
is deterministic given the table. ``interlock doctor kernels`` prints it.

Candidates (``IMPLS``):
  small   ``cpu_ops.linear_small``: weights packed once for AVX-512 BF16 dot products
  onednn  ``torch.ops.mkldnn._linear_pointwise`` on a weight re-laid out once (AMX where present)
  torch   ``F.linear`` on the plain weight (re-laid out by oneDNN per call)

A candidate only wins a row range by beating the incumbent (the one that won the range below)
by more than ``MARGIN``, so measurement noise does not make the table flap between neighbours.

A machine busy with other work measures wrong (multi-threaded kernels suffer most), and a
table is kept for good. So a fixed calibration matmul is timed between the shapes: when its
times spread by more than ``QUIET_SPREAD`` the table is *provisional*: used, saved, and
measured again by the next start that finds the machine quiet (a few calibration calls).
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import json
import logging
import os
import platform
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

log = logging.getLogger(__name__)

IMPLS = ("small", "onednn", "torch")
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
MARGIN = 0.05
QUIET_SPREAD = 1.3
FORMAT = 1


@dataclass(frozen=True, slots=True)
class LinearPlan:
    """One weight shape's choice: rows up to ``bounds[i]`` use ``impls[i]`` (the last one
    beyond too)."""

    bounds: tuple[int, ...]
    impls: tuple[str, ...]

    def impl_for(self, rows: int) -> str:
        i = bisect.bisect_left(self.bounds, rows)
        return self.impls[min(i, len(self.impls) - 1)]

    @property
    def used(self) -> frozenset[str]:
        return frozenset(self.impls)

    @staticmethod
    def only(impl: str) -> LinearPlan:
        return LinearPlan((ROW_BUCKETS[-1],), (impl,))


@dataclass(frozen=True)
class KernelTable:
    machine: str
    """What the measurements hold for (see ``machine_key``)."""
    plans: Mapping[tuple[int, int], LinearPlan]
    """(out_features, in_features) -> plan."""
    timings: Mapping[str, Mapping[str, Mapping[int, float]]]
    """"N x K" -> impl -> rows -> seconds per call (what the plans were chosen from)."""
    provisional: bool = False
    """Measured on a busy machine: to be measured again when it is quiet."""

    def plan(self, shape: tuple[int, int]) -> LinearPlan | None:
        return self.plans.get(shape)

    def to_json(self) -> str:
        return json.dumps({
            "format": FORMAT, "machine": self.machine, "provisional": self.provisional,
            "plans": {f"{n}x{k}": {"bounds": list(p.bounds), "impls": list(p.impls)}
                      for (n, k), p in sorted(self.plans.items())},
            "timings": {s: {i: {str(r): t for r, t in rows.items()} for i, rows in impls.items()}
                        for s, impls in self.timings.items()},
        }, indent=1)

    @staticmethod
    def from_json(text: str) -> KernelTable:
        data = json.loads(text)
        if data.get("format") != FORMAT:
            raise ValueError("kernel table of another format")
        plans = {}
        for key, p in data["plans"].items():
            n, k = (int(x) for x in key.split("x"))
            plans[(n, k)] = LinearPlan(tuple(p["bounds"]), tuple(p["impls"]))
        timings = {s: {i: {int(r): float(t) for r, t in rows.items()} for i, rows in impls.items()}
                   for s, impls in data.get("timings", {}).items()}
        return KernelTable(data["machine"], plans, timings, bool(data.get("provisional", False)))

    def describe(self) -> str:
        """The table as text: per shape, each row range and the kernel it uses, with timings."""
        lines = [f"machine: {self.machine}" + (" (provisional: measured while busy)" if self.provisional else "")]
        for (n, k), plan in sorted(self.plans.items()):
            lines.append(f"linear {n} x {k}:")
            low = 1
            for bound, impl in zip(plan.bounds, plan.impls, strict=True):
                last = bound == plan.bounds[-1]
                span = f"rows {low}+" if last else f"rows {low}-{bound}"
                lines.append(f"  {span:<16} {impl}")
                low = bound + 1
            times = self.timings.get(f"{n}x{k}", {})
            if times:
                rows = sorted({r for t in times.values() for r in t})
                lines.append("  measured (us per call): " + ", ".join(
                    f"{r}: " + "/".join(f"{i} {times[i][r] * 1e6:.0f}" for i in sorted(times) if r in times[i])
                    for r in rows))
        return "\n".join(lines)


# ---- choosing (pure) ----
def choose(times: Mapping[str, Mapping[int, float]], margin: float = MARGIN) -> LinearPlan:
    """The plan from measured seconds per call: ``times[impl][rows]``. Adjacent buckets with the
    same winner merge into one range."""
    impls = [i for i in IMPLS if i in times]
    rows = sorted({r for i in impls for r in times[i]})
    if not rows:
        raise ValueError("nothing measured")
    winners: list[str] = []
    for r in rows:
        have = [i for i in impls if r in times[i]]
        best = min(have, key=lambda i: times[i][r])
        incumbent = winners[-1] if winners else None
        if incumbent in have and times[best][r] >= times[incumbent][r] * (1 - margin):  # type: ignore[index]
            best = incumbent  # type: ignore[assignment]
        winners.append(best)
    bounds: list[int] = []
    chosen: list[str] = []
    for r, impl in zip(rows, winners, strict=True):
        if chosen and chosen[-1] == impl:
            bounds[-1] = r
        else:
            bounds.append(r)
            chosen.append(impl)
    return LinearPlan(tuple(bounds), tuple(chosen))


# ---- measuring ----
def machine_key(extra: Iterable[str] = ()) -> str:
    """CPU model and flags, thread count, torch version and kernel source: what a measurement
    depends on. Readable, then a hash of the flags."""
    model, flags = _cpu()
    parts = [model, f"threads={torch.get_num_threads()}", f"torch={torch.__version__}", *extra]
    return " | ".join(parts) + " | flags=" + hashlib.sha256(flags.encode()).hexdigest()[:12]


def _cpu() -> tuple[str, str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown", ""
    model = flags = ""
    for line in text.splitlines():
        if not model and line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
        elif not flags and line.startswith("flags"):
            flags = line.split(":", 1)[1].strip()
    return model or "unknown", flags


def time_calls(fns: Mapping[str, Callable[[], object]], *, min_s: float = 0.005, reps: int = 4
               ) -> dict[str, float]:
    """Seconds per call of each function: the best of ``reps`` batches (each at least ``min_s``
    long), the functions' batches interleaved so a burst of load elsewhere hits all alike."""
    counts = {}
    for name, fn in fns.items():
        fn()  # warm: first-call packing, page faults
        t0 = time.perf_counter()
        fn()
        counts[name] = max(1, int(min_s / max(time.perf_counter() - t0, 1e-7)))
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(reps):
        for name, fn in fns.items():
            n = counts[name]
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            best[name] = min(best[name], (time.perf_counter() - t0) / n)
    return best


def monotone(times: Mapping[int, float]) -> dict[int, float]:
    """A call on more rows never takes less time: a smaller bucket measured slower than a larger
    one was disturbed, and takes the larger one's time."""
    out: dict[int, float] = {}
    floor = float("inf")
    for rows in sorted(times, reverse=True):
        floor = min(floor, times[rows])
        out[rows] = floor
    return dict(sorted(out.items()))


def measure(shape: tuple[int, int], candidates: Mapping[str, Callable[[torch.Tensor], torch.Tensor]],
            max_rows: int, dtype: torch.dtype = torch.bfloat16) -> dict[str, dict[int, float]]:
    """``times[impl][rows]`` for ``rows`` in ``ROW_BUCKETS`` up to ``max_rows`` (and it),
    made monotone in rows."""
    _n, k = shape
    buckets = [r for r in ROW_BUCKETS if r < max_rows] + [max_rows]
    raw: dict[str, dict[int, float]] = {i: {} for i in candidates}
    for rows in buckets:
        x = torch.randn(rows, k, generator=_GEN).to(dtype)
        got = time_calls({impl: functools.partial(fn, x) for impl, fn in candidates.items()})
        for impl, t in got.items():
            raw[impl][rows] = t
    return {impl: monotone(t) for impl, t in raw.items()}


def cache_path(cache_dir: Path, machine: str) -> Path:
    return cache_dir / "kernels" / (hashlib.sha256(machine.encode()).hexdigest()[:16] + ".json")


def load_or_measure(shapes: Sequence[tuple[int, int]], make: Callable[[tuple[int, int]], Mapping[str, Callable[
        [torch.Tensor], torch.Tensor]]], *, max_rows: int, cache_dir: Path, machine: str) -> KernelTable:
    """The cached table for this machine, measuring (and saving) the shapes it lacks.

    ``make(shape)`` gives the candidates for a random weight of that shape."""
    path = cache_path(cache_dir, machine)
    table = KernelTable(machine, {}, {})
    try:
        table = KernelTable.from_json(path.read_text())
        if table.machine != machine:
            table = KernelTable(machine, {}, {})
    except (OSError, ValueError, KeyError):
        pass
    if table.provisional and quiet():
        table = KernelTable(machine, {}, {})  # measured while busy, and now it is quiet: again
    missing = [s for s in dict.fromkeys(shapes) if s not in table.plans]
    if not missing:
        return table
    plans = dict(table.plans)
    timings: dict[str, Mapping[str, Mapping[int, float]]] = dict(table.timings)
    started = time.perf_counter()
    calibration = [_calibrate()]
    for shape in missing:
        times = measure(shape, make(shape), max_rows)
        plans[shape] = choose(times)
        timings[f"{shape[0]}x{shape[1]}"] = times
        calibration.append(_calibrate())
    busy = max(calibration) > QUIET_SPREAD * min(calibration)
    table = KernelTable(machine, plans, timings, provisional=table.provisional or busy)
    log.info("measured linear kernels for %d shapes in %.1f s%s (cached in %s)", len(missing),
             time.perf_counter() - started, ", machine busy: provisional" if busy else "", path)
    log.info("%s", table.describe())
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_suffix(f".{os.getpid()}.tmp")
    scratch.write_text(table.to_json())
    os.replace(scratch, path)
    return table


_GEN = torch.Generator().manual_seed(0)  # measuring never touches torch's global RNG
_CAL = (torch.randn(256, 512, generator=_GEN).to(torch.bfloat16),
        torch.randn(512, 512, generator=_GEN).to(torch.bfloat16))


def _calibrate() -> float:
    a, b = _CAL
    return min(time_calls({"cal": functools.partial(torch.matmul, a, b)}, reps=3).values(), default=0.0)


def quiet(samples: int = 4) -> bool:
    """Whether the calibration matmul times steadily now (a few ms)."""
    times = [_calibrate() for _ in range(samples)]
    return max(times) <= QUIET_SPREAD * min(times)
