"""What this machine offers the workers started on it, and what a model folder will take, as
placement (``planner.placement``) reads them: detected without loading anything (no CUDA
library, no weights)."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from interlock.planner.placement import Host


def local_host() -> Host:
    """This machine as placement sees it: the cores this process may run on (its CPU
    affinity: a container's or ``taskset``'s limit, not the machine's), MemTotal, and the GPUs
    the NVIDIA driver lists (read from /proc: no CUDA library is loaded to count them)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    memory = None
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = int(line.split()[1]) * 1024
    devices = 0
    with contextlib.suppress(OSError):
        devices = len(os.listdir("/proc/driver/nvidia/gpus"))
    return Host("local", float(cores), devices, memory)


def model_footprint(path: str) -> tuple[int, int]:
    """A model folder's weight bytes (its weight files' sizes) and KV bytes per token
    (``2 x layers x kv_heads x head_dim`` at 4 bytes, the widest dtype): what placement
    estimates a worker's memory from, without loading anything. (0, 0) where unknown."""
    root = Path(path)
    weights = 0
    with contextlib.suppress(OSError):
        files = [root] if root.is_file() else list(root.iterdir())
        weights = sum(f.stat().st_size for f in files if f.suffix in (".safetensors", ".bin", ".gguf", ".pt"))
    kv = 0
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError, ZeroDivisionError):
        c = json.loads((root / "config.json").read_text())
        heads = c["num_attention_heads"]
        head_dim = c.get("head_dim") or c["hidden_size"] // heads
        kv = 2 * c["num_hidden_layers"] * c.get("num_key_value_heads", heads) * head_dim * 4
    return weights, kv
