"""Process and build figures every Interlock process serves: CPU time, memory, open file
descriptors, start time (``process_*``, as Prometheus' client libraries name them) and
``interlock_build_info``. Read from ``/proc`` at scrape time (Linux); elsewhere only what the
standard library knows."""

from __future__ import annotations

import os
import resource
import sys
import time

from interlock.metrics.registry import Registry, Samples

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("interlock")
    except Exception:  # noqa: BLE001 - not installed as a distribution (a source tree)
        return "unknown"


def register_process(registry: Registry, component: str) -> None:
    """Add the process figures and ``interlock_build_info{component=...}`` to ``registry``."""
    started = _start_time()
    build = ((_version(), sys.version.split()[0], component), 1.0)
    registry.collect("interlock_build_info", lambda: (build,))
    registry.collect("process_cpu_seconds_total", lambda: (((), _cpu_seconds()),))
    registry.collect("process_resident_memory_bytes", lambda: _memory(1))
    registry.collect("process_virtual_memory_bytes", lambda: _memory(0))
    registry.collect("process_open_fds", _open_fds)
    registry.collect("process_max_fds", lambda: (((), float(resource.getrlimit(resource.RLIMIT_NOFILE)[0])),))
    registry.collect("process_start_time_seconds", lambda: (((), started),))


def _cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def _memory(field: int) -> Samples:
    """``/proc/self/statm``: field 0 the virtual size, 1 the resident set, in pages."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return (((), float(int(f.read().split()[field]) * _PAGE)),)
    except OSError:
        if field == 1:  # the peak, where /proc is absent (ru_maxrss is KiB on Linux, bytes on macOS)
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            return (((), float(rss if sys.platform == "darwin" else rss * 1024)),)
        return ()


def _open_fds() -> Samples:
    try:
        return (((), float(len(os.listdir("/proc/self/fd")))),)
    except OSError:
        return ()


def _start_time() -> float:
    """Seconds since the epoch when this process started (``/proc``), else now."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        with open("/proc/stat", "rb") as f:
            boot = next(float(line.split()[1]) for line in f if line.startswith(b"btime"))
        return boot + int(fields[19]) / _TICKS
    except (OSError, IndexError, StopIteration, ValueError):
        return time.time()
