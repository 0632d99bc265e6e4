"""The model's dtype when it is "auto" (the default): bf16 where this machine computes bf16 fast,
fp32 where it does not, chosen by measurement.

bf16 halves the weights' and the KV cache's memory, and on a CPU with AVX-512 BF16 or AMX it
is also the fastest path (the fused kernels, oneDNN's tiles). On a CPU without them (an AVX2
machine such as an AMD Zen 3) PyTorch computes a bf16 matmul by converting to fp32 and back:
measured 3-4x slower than fp32 at the model's shapes, so a 512-token prefill took 3-4x longer
in the default bf16 than it would in fp32. No CPU flag alone says which is faster for a given
build of PyTorch, so:

* on CUDA: bf16 where the device supports it, else fp16;
* on a CPU where the fused bf16 kernels run: bf16 (their path was measured the fastest there,
  and ``dispatch`` measures each operation against oneDNN anyway);
* on any other CPU: the model's linear layers (the four weight shapes of a layer) are timed in
  bf16 and in fp32 at a decode batch, a small and a large prefill chunk; bf16 is kept unless
  fp32 is faster by more than ``FP32_MARGIN`` over those sizes (geometric mean): an fp32 cache
  holds half the tokens in the same memory, which a small edge in speed does not repay.

The choice is cached per machine (CPU model and flags, threads, torch version), like the kernel
table, so later starts read it; ``interlock doctor kernels`` prints it, ``scripts/setup.sh``
makes it ahead. An explicit dtype (``--dtype bfloat16`` / ``float32`` / ``float16``) is used as
given.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from interlock.engine.model import cpu_ops
from interlock.engine.model.config import ModelArchConfig
from interlock.engine.model.kernel_choice import machine_key, random, time_calls
from interlock.errors import ConfigError
from interlock.names import DTYPES

log = logging.getLogger(__name__)

AUTO = "auto"
TORCH_DTYPES = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
}
"""What each name in ``names.DTYPES`` (besides ``auto``) loads the model in."""
ROWS = (1, 16, 256)
"""Rows timed: a decode step, a small and a large prefill chunk."""
FP32_MARGIN = 1.3
"""fp32 is chosen only when bf16 takes more than this many times as long."""
FORMAT = 1


@dataclass(frozen=True, slots=True)
class DtypeChoice:
    dtype: torch.dtype
    why: str
    """One line: what was measured or why nothing was."""
    ratio: float | None = None
    """bf16 time over fp32 time (geometric mean over ``ROWS``); None when not measured."""


def check(name: str) -> None:
    """Refuse an unknown dtype name by name."""
    if name not in DTYPES:
        raise ConfigError(f"dtype {name!r} is not supported (one of {', '.join(DTYPES)})")


def resolve(
    name: str, device: torch.device, config: ModelArchConfig, *, cache_dir: Path, fused: bool = True
) -> DtypeChoice:
    """The dtype to load the model in (module docstring). ``fused``: the fused CPU kernels
    may be used (False: the plain PyTorch path was asked for)."""
    check(name)
    if name != AUTO:
        return DtypeChoice(TORCH_DTYPES[name], f"{name} as configured")
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return DtypeChoice(torch.bfloat16, "auto: bfloat16 (the device supports it)")
        return DtypeChoice(torch.float16, "auto: float16 (the device has no bfloat16)")
    if device.type != "cpu":
        return DtypeChoice(torch.float32, f"auto: float32 on {device.type}")
    from interlock.engine.model.dispatch import fused_layers_usable

    if fused and fused_layers_usable(config) and cpu_ops.load() is not None:
        return DtypeChoice(torch.bfloat16, "auto: bfloat16 (the fused bf16 CPU kernels run here)")
    return _measured(config, cache_dir)


def _measured(config: ModelArchConfig, cache_dir: Path) -> DtypeChoice:
    shapes = _shapes(config)
    machine = machine_key([f"shapes={shapes}"])
    path = cache_dir / "dtype" / f"{hashlib.sha256(machine.encode()).hexdigest()[:16]}-v{FORMAT}.json"
    ratio = _read(path, machine)
    if ratio is not None:
        return _choice(ratio, cached=True)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(path.with_suffix(".lock"), "a")  # held until measured and saved
    except OSError as e:  # a read-only cache costs a measurement per start, nothing else
        log.warning("dtype choice not cached (%s)", e)
        return _choice(bf16_over_fp32(shapes), cached=False)
    with lock:
        # Workers starting together measure once: the first, under the lock; the others then
        # read its answer (two measurements near the margin could disagree, and workers of
        # one model must load it in one dtype to share KV).
        fcntl.flock(lock, fcntl.LOCK_EX)
        ratio = _read(path, machine)
        if ratio is not None:
            return _choice(ratio, cached=True)
        ratio = bf16_over_fp32(shapes)
        scratch = path.with_suffix(f".{os.getpid()}.tmp")
        scratch.write_text(json.dumps({"machine": machine, "ratio": ratio}))
        os.replace(scratch, path)
    return _choice(ratio, cached=False)


def _read(path: Path, machine: str) -> float | None:
    try:
        saved = json.loads(path.read_text())
        return float(saved["ratio"]) if saved.get("machine") == machine else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _choice(ratio: float, *, cached: bool) -> DtypeChoice:
    how = "cached measurement" if cached else "measured now"
    figures = f"bf16 linear layers {ratio:.2f}x the time of fp32 on this CPU ({how})"
    if ratio > FP32_MARGIN:
        return DtypeChoice(torch.float32, f"auto: float32: {figures}", ratio)
    return DtypeChoice(torch.bfloat16, f"auto: bfloat16: {figures}", ratio)


def _shapes(config: ModelArchConfig) -> tuple[tuple[int, int], ...]:
    from interlock.engine.model.dispatch import layer_shapes

    return tuple(layer_shapes(config))


def bf16_over_fp32(shapes: tuple[tuple[int, int], ...], rows: tuple[int, ...] = ROWS) -> float:
    """Time of a layer's linear layers in bf16 over fp32, geometric mean over ``rows``."""
    logs = []
    for n in rows:
        calls = {}
        for dtype in (torch.bfloat16, torch.float32):
            pairs = [(random(n, k, dtype=dtype), random(m, k, dtype=dtype, scale=k**-0.5)) for m, k in shapes]
            calls[str(dtype)] = functools.partial(_layer, pairs)
        times = time_calls(calls)
        logs.append(math.log(times[str(torch.bfloat16)] / times[str(torch.float32)]))
    return math.exp(sum(logs) / len(logs))


def _layer(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    with torch.inference_mode():
        for x, w in pairs:
            F.linear(x, w)
