"""The only module that reads environment variables. Read once, typed, frozen."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path


@dataclass(frozen=True)
class Env:
    cache_dir: Path
    """Where converted models live (INTERLOCK_CACHE_DIR, default ~/.cache/interlock)."""
    log_level: str
    """INTERLOCK_LOG_LEVEL, default INFO."""
    num_threads: int
    """INTERLOCK_NUM_THREADS: torch intra-op threads; 0 means all cores."""
    nats_url: str | None
    """INTERLOCK_NATS_URL: default NATS server for workers and frontends."""
    omp_wait_policy: str
    """OMP_WAIT_POLICY handed to worker processes, default PASSIVE: spinning OpenMP threads
    starve the other workers sharing the cores (10-20x slower on a busy 2-core machine)."""


@cache
def get_env() -> Env:
    cache_dir = os.environ.get("INTERLOCK_CACHE_DIR") or str(Path.home() / ".cache" / "interlock")
    return Env(
        cache_dir=Path(cache_dir),
        log_level=os.environ.get("INTERLOCK_LOG_LEVEL", "INFO").upper(),
        num_threads=int(os.environ.get("INTERLOCK_NUM_THREADS", "0") or 0),
        nats_url=os.environ.get("INTERLOCK_NATS_URL") or None,
        omp_wait_policy=os.environ.get("OMP_WAIT_POLICY") or "PASSIVE",
    )
