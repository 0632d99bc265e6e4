"""Which implementation each operation uses, for each size, chosen by measurement.

No CPU flag says which kernel is fastest for a given shape: on an AMD Zen with AVX-512 BF16 the
small-batch linear kernel (``cpu_ops.linear_small``) beat oneDNN at every size the engine
meets, while on an Intel Xeon with AMX oneDNN's tiles won a 512-token prefill 3-4x; the same
question stands for attention (our AVX-512 flash kernel against oneDNN's matmuls) and, less
sharply, for the element-wise kernels. So the first time a model loads on a machine, every
candidate of every operation (an ``Op``: a linear weight shape, attention of one kind, an
element-wise kernel) is timed over a range of sizes (rows of a step, decode batch, prefill
chunk), and each range goes to the fastest. The table is cached by machine (CPU model, flags,
threads, torch, kernel source), so later starts read it; the choice is deterministic given the
table. ``interlock doctor kernels`` prints it; ``scripts/setup.sh`` measures it ahead.

Candidates: see ``dispatch.py`` (``LINEAR_IMPLS`` for linear layers, ``FUSED_IMPLS`` for the
rest). A candidate only wins a size range by beating the incumbent (the one that won the range
below) by more than ``MARGIN`` there and at the next size measured, so measurement noise does
not make the table flap between neighbours.

A machine busy with other work measures wrong (multi-threaded kernels suffer most), and a
table is kept for good. So a fixed calibration matmul is timed between the operations: when
its times spread by more than ``QUIET_SPREAD`` the table is *provisional*: used, saved, and
measured again by the next start that finds the machine quiet (a few calibration calls), at
most once per ``REMEASURE_AFTER_S``: on a machine shared with other work a quiet moment at
start says little, and every start re-measuring would cost each one the budget.
"""

from __future__ import annotations

import bisect
import fcntl
import functools
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from interlock.machine import cpu_info

log = logging.getLogger(__name__)

ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 256, 1024, 4096, 16384)
"""Sizes measured: every power of two where decode steps live, then every fourth (a range
between two buckets goes to the larger one's winner)."""
MARGIN = 0.05
QUIET_SPREAD = 1.3
FORMAT = 2
SLOW_CALL_S = 0.02
"""A call slower than this is timed once more after its first timed call, not in batches (it
is measured well enough, and prefill-sized calls would otherwise make the measurement long)."""
REMEASURE_AFTER_S = 3600.0
BUDGET_S = 30.0
"""Measuring stops after this long (after one operation at least); the operations left keep
their default kernel until a later start measures them (each start measures only what its
cached table lacks)."""


@dataclass(frozen=True, slots=True)
class Plan:
    """One operation's choice: sizes up to ``bounds[i]`` use ``impls[i]`` (the last one
    beyond too)."""

    bounds: tuple[int, ...]
    impls: tuple[str, ...]

    def impl_for(self, size: int) -> str:
        i = bisect.bisect_left(self.bounds, size)
        return self.impls[min(i, len(self.impls) - 1)]

    @property
    def used(self) -> frozenset[str]:
        return frozenset(self.impls)

    @staticmethod
    def only(impl: str) -> Plan:
        return Plan((ROW_BUCKETS[-1],), (impl,))


@dataclass(frozen=True, slots=True)
class Op:
    """An operation to measure: its table key, the sizes to time, and for a size each
    candidate as a call with its inputs bound."""

    key: str
    """What the plan is for, e.g. ``linear 960x576``, ``attention decode 9/3x64 ctx 256``."""
    sizes: tuple[int, ...]
    calls: Callable[[int], Mapping[str, Callable[[], object]]]


@dataclass(frozen=True)
class KernelTable:
    machine: str
    """What the measurements hold for (see ``machine_key``)."""
    plans: Mapping[str, Plan]
    """Op key -> plan."""
    timings: Mapping[str, Mapping[str, Mapping[int, float]]]
    """Op key -> impl -> size -> seconds per call (what the plans were chosen from)."""
    provisional: bool = False
    """Measured on a busy machine: to be measured again when it is quiet."""
    measured_at: float = 0.0
    """Unix time of the last measurement."""

    def plan(self, key: str) -> Plan | None:
        return self.plans.get(key)

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": FORMAT,
                "machine": self.machine,
                "provisional": self.provisional,
                "measured_at": self.measured_at,
                "plans": {
                    key: {"bounds": list(p.bounds), "impls": list(p.impls)}
                    for key, p in sorted(self.plans.items())
                },
                "timings": {
                    key: {i: {str(r): t for r, t in sizes.items()} for i, sizes in impls.items()}
                    for key, impls in self.timings.items()
                },
            },
            indent=1,
        )

    @staticmethod
    def from_json(text: str) -> KernelTable:
        data = json.loads(text)
        if data.get("format") != FORMAT:
            raise ValueError("kernel table of another format")
        plans = {key: Plan(tuple(p["bounds"]), tuple(p["impls"])) for key, p in data["plans"].items()}
        timings = {
            key: {i: {int(r): float(t) for r, t in sizes.items()} for i, sizes in impls.items()}
            for key, impls in data.get("timings", {}).items()
        }
        return KernelTable(
            data["machine"],
            plans,
            timings,
            bool(data.get("provisional", False)),
            float(data.get("measured_at", 0.0)),
        )

    def describe(self) -> str:
        """The table as text: per operation, each size range and the kernel it uses, with timings."""
        lines = [
            f"machine: {self.machine}" + (" (provisional: measured while busy)" if self.provisional else "")
        ]
        for key, plan in sorted(self.plans.items()):
            unit = _unit(key)
            lines.append(f"{key}:")
            low = 1
            for bound, impl in zip(plan.bounds, plan.impls, strict=True):
                last = bound == plan.bounds[-1]
                span = f"{unit} {low}+" if last else f"{unit} {low}-{bound}"
                lines.append(f"  {span:<18} {impl}")
                low = bound + 1
            times = self.timings.get(key, {})
            if times:
                sizes = sorted({r for t in times.values() for r in t})
                lines.append(
                    "  measured (us per call): "
                    + ", ".join(
                        f"{r}: "
                        + "/".join(f"{i} {times[i][r] * 1e6:.0f}" for i in sorted(times) if r in times[i])
                        for r in sizes
                    )
                )
        return "\n".join(lines)


def _unit(key: str) -> str:
    if key.startswith("attention decode"):
        return "batch"
    if key.startswith("attention prefill"):
        return "chunk"
    return "rows"


# ---- choosing (pure) ----
def choose(times: Mapping[str, Mapping[int, float]], margin: float = MARGIN) -> Plan:
    """The plan from measured seconds per call: ``times[impl][size]`` (the first impl in
    ``times`` wins exact ties). A challenger displaces the incumbent (the smaller sizes' winner)
    only when faster by more than ``margin`` at this size and at the next one measured (if any):
    a one-size win is noise more often than a crossover. Adjacent buckets with the same winner
    merge into one range."""
    impls = list(times)
    sizes = sorted({r for i in impls for r in times[i]})
    if not sizes:
        raise ValueError("nothing measured")

    def beats(a: str, b: str, r: int) -> bool:
        return r in times[a] and r in times[b] and times[a][r] < times[b][r] * (1 - margin)

    winners: list[str] = []
    for n, r in enumerate(sizes):
        have = [i for i in impls if r in times[i]]
        best = min(have, key=lambda i: times[i][r])
        incumbent = winners[-1] if winners else None
        if incumbent in have and best != incumbent:
            after = sizes[n + 1 :]
            assert incumbent is not None
            if not beats(best, incumbent, r) or (after and not beats(best, incumbent, after[0])):
                best = incumbent
        winners.append(best)
    bounds: list[int] = []
    chosen: list[str] = []
    for r, impl in zip(sizes, winners, strict=True):
        if chosen and chosen[-1] == impl:
            bounds[-1] = r
        else:
            bounds.append(r)
            chosen.append(impl)
    return Plan(tuple(bounds), tuple(chosen))


def buckets(limit: int, low: int = 1) -> tuple[int, ...]:
    """``ROW_BUCKETS`` from ``low`` up to ``limit``, and ``limit`` itself."""
    return tuple(r for r in ROW_BUCKETS if low <= r < limit) + (limit,)


# ---- measuring ----
def machine_key(extra: Iterable[str] = ()) -> str:
    """CPU model and flags, thread count, torch version and kernel source: what a measurement
    depends on. Readable, then a hash of the flags."""
    model, flags = cpu_info()
    parts = [model, f"threads={torch.get_num_threads()}", f"torch={torch.__version__}", *extra]
    return " | ".join(parts) + " | flags=" + hashlib.sha256(flags.encode()).hexdigest()[:12]


def time_calls(
    fns: Mapping[str, Callable[[], object]], *, min_s: float = 0.005, reps: int = 4
) -> dict[str, float]:
    """Seconds per call of each function: the best of ``reps`` batches (each at least ``min_s``
    long), the functions' batches interleaved so a burst of load elsewhere hits all alike.
    When a function is slower than ``SLOW_CALL_S``, one more call each is all."""
    counts = {}
    best = {}
    for name, fn in fns.items():
        fn()  # warm: first-call packing, page faults
        t0 = time.perf_counter()
        fn()
        best[name] = time.perf_counter() - t0
        counts[name] = max(1, int(min_s / max(best[name], 1e-7)))
    if max(best.values(), default=0.0) > SLOW_CALL_S:
        reps = 1
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


def measure(op: Op) -> dict[str, dict[int, float]]:
    """``times[impl][size]`` for each of the op's sizes, made monotone in size."""
    raw: dict[str, dict[int, float]] = {}
    for size in op.sizes:
        for impl, t in time_calls(op.calls(size)).items():
            raw.setdefault(impl, {})[size] = t
    return {impl: monotone(t) for impl, t in raw.items()}


def cache_path(cache_dir: Path, machine: str) -> Path:
    return cache_dir / "kernels" / f"{hashlib.sha256(machine.encode()).hexdigest()[:16]}-v{FORMAT}.json"


def load_or_measure(
    ops: Sequence[Op],
    *,
    cache_dir: Path,
    machine: str,
    progress: Callable[[str], None] | None = None,
    budget_s: float = BUDGET_S,
) -> KernelTable:
    """The cached table for this machine, measuring (and saving) the ops it lacks, for at most
    about ``budget_s`` (see ``BUDGET_S``). ``progress`` gets a line per op (default: the log).
    Processes starting together (``serve``'s workers) measure one at a time, under a file lock:
    the first measures, the others then read its table."""
    path = cache_path(cache_dir, machine)
    table = _read(path, machine)
    if not _missing(ops, table) and not _maybe_stale(table):
        log.info(
            "kernel choice for %d operations read from %s%s (interlock doctor kernels prints it)",
            len(table.plans),
            path,
            ", provisional" if table.provisional else "",
        )
        return table
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        table = _read(path, machine)
        if _maybe_stale(table) and quiet():
            table = KernelTable(machine, {}, {})  # measured while busy, and now it is quiet: again
        missing = _missing(ops, table)
        if not missing:
            return table
        table = _measure_missing(table, missing, progress or log.info, budget_s, path)
        scratch = path.with_suffix(f".{os.getpid()}.tmp")
        scratch.write_text(table.to_json())
        os.replace(scratch, path)
    return table


def _read(path: Path, machine: str) -> KernelTable:
    try:
        table = KernelTable.from_json(path.read_text())
    except (OSError, ValueError, KeyError):
        return KernelTable(machine, {}, {})
    return table if table.machine == machine else KernelTable(machine, {}, {})


def _missing(ops: Sequence[Op], table: KernelTable) -> list[Op]:
    return list({op.key: op for op in ops if op.key not in table.plans}.values())


def _maybe_stale(table: KernelTable) -> bool:
    return table.provisional and time.time() - table.measured_at > REMEASURE_AFTER_S


def _measure_missing(
    table: KernelTable, missing: Sequence[Op], say: Callable[[str], None], budget_s: float, path: Path
) -> KernelTable:
    plans = dict(table.plans)
    timings: dict[str, Mapping[str, Mapping[int, float]]] = dict(table.timings)
    started = time.perf_counter()
    say(f"measuring kernels for {len(missing)} operations on this machine (once; cached in {path})")
    calibration = [_calibrate()]
    for n, op in enumerate(missing, 1):
        if n > 1 and time.perf_counter() - started > budget_s:  # one op at least: each start gets on
            say(
                f"  measuring stopped after {budget_s:.0f} s: {len(missing) - n + 1} operations keep their "
                "default kernel until a later start measures them"
            )
            break
        times = measure(op)
        plans[op.key] = choose(times)
        timings[op.key] = times
        calibration.append(_calibrate())
        say(
            f"  [{n}/{len(missing)}] {op.key}: {_brief(plans[op.key], _unit(op.key))} "
            f"({time.perf_counter() - started:.1f} s)"
        )
    busy = max(calibration) > QUIET_SPREAD * min(calibration)
    measured = KernelTable(
        table.machine, plans, timings, provisional=table.provisional or busy, measured_at=time.time()
    )
    say(
        f"measured in {time.perf_counter() - started:.1f} s" + (", machine busy: provisional" if busy else "")
    )
    log.info("%s", measured.describe())
    return measured


def _brief(plan: Plan, unit: str) -> str:
    low, parts = 1, []
    for bound, impl in zip(plan.bounds, plan.impls, strict=True):
        parts.append(
            f"{impl} ({unit} {low}+)" if bound == plan.bounds[-1] else f"{impl} ({unit} {low}-{bound})"
        )
        low = bound + 1
    return ", ".join(parts)


_GEN = torch.Generator().manual_seed(0)  # measuring never touches torch's global RNG
_CAL = (
    torch.randn(256, 512, generator=_GEN).to(torch.bfloat16),
    torch.randn(512, 512, generator=_GEN).to(torch.bfloat16),
)


def random(*shape: int, dtype: torch.dtype = torch.bfloat16, scale: float = 1.0) -> torch.Tensor:
    """A measurement input (from this module's generator, never torch's global one); large ones
    repeat a random run of ``_RUN`` values (drawing 100 MB of normals took longer than timing)."""
    numel = 1
    for n in shape:
        numel *= n
    values = (torch.randn(min(numel, _RUN), generator=_GEN) * scale).to(dtype)
    return values.repeat(-(-numel // _RUN))[:numel].view(shape) if numel > _RUN else values.view(shape)


_RUN = 1 << 20


def _calibrate() -> float:
    a, b = _CAL
    return min(time_calls({"cal": functools.partial(torch.matmul, a, b)}, reps=3).values(), default=0.0)


def quiet(samples: int = 4) -> bool:
    """Whether the calibration matmul times steadily now (a few ms)."""
    times = [_calibrate() for _ in range(samples)]
    return max(times) <= QUIET_SPREAD * min(times)
