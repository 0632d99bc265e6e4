"""Giving freed heap memory back to the system.

glibc keeps what a process frees in its malloc arenas, so a large transient allocation (a
tokenizer's JSON parsed at load, weights dropped at offload) stays in the process's RSS for good.
``trim`` asks it to return the free pages (``malloc_trim(0)``, every arena); elsewhere (musl,
macOS) it does nothing.
"""

from __future__ import annotations

import ctypes
from functools import cache


@cache
def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def trim() -> None:
    """Return the heap's free pages to the system where the C library can."""
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


__all__ = ["trim"]
