"""Facts about this machine's CPU that measurements are keyed by (read once from /proc/cpuinfo)."""

from __future__ import annotations

import platform
from functools import cache
from pathlib import Path


@cache
def cpu_info() -> tuple[str, str]:
    """The CPU's model name and its flags, as /proc/cpuinfo gives them (the processor's name and
    no flags where it cannot be read)."""
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


__all__ = ["cpu_info"]
