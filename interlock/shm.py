"""Shared-memory segments that outlive the processes that made them.

A Python ``multiprocessing.shared_memory`` segment (``/dev/shm/psm_<hex>``) stays until someone
unlinks it, and it is RAM. vLLM's engine core and its executor's worker process share two (its
message queues, 160 and 240 MiB on a CPU) and unlink them when they shut down cleanly; a
SIGKILLed engine core leaves them, and a supervisor that restarts it would leave 400 MiB more at
every death. So whoever kills such processes first asks which segments they map
(``mapped_by``), or which were made while they started (``created_since``), then, once they
are gone, unlinks those no live process maps any more (``release``). Only ``psm_`` names are
touched: a segment of any other kind is not ours to judge. Linux only (``/proc``); elsewhere every function finds nothing.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Collection, Iterable
from pathlib import Path

SHM_DIR = Path("/dev/shm")
PREFIX = "psm_"
"""The names ``multiprocessing.shared_memory.SharedMemory`` gives segments it names itself."""


def _pids() -> list[int]:
    try:
        return [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (state, ppid, pgrp, ...)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def group_members(pgid: int) -> list[int]:
    """The live processes of process group ``pgid``."""
    found = []
    for pid in _pids():
        fields = _stat_fields(pid)
        if fields is not None and fields[0] != "Z" and int(fields[2]) == pgid:
            found.append(pid)
    return found


def descendants(pid: int) -> list[int]:
    """The live processes below ``pid`` (children, their children, ...)."""
    children: dict[int, list[int]] = {}
    for p in _pids():
        fields = _stat_fields(p)
        if fields is not None and fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(p)
    found, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        found.append(p)
        todo += children.get(p, [])
    return found


def mapped_by(pids: Iterable[int]) -> set[str]:
    """The names of the ``psm_`` segments these processes map (and have not unlinked)."""
    names: set[str] = set()
    marker = f" {SHM_DIR}/{PREFIX}"
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as maps:
                for line in maps:
                    at = line.find(marker)
                    if at >= 0 and not line.rstrip().endswith("(deleted)"):
                        names.add(line[at + len(marker) - len(PREFIX) :].split()[0])
        except OSError:
            continue
    return names


def listing() -> set[str]:
    """The names of the ``psm_`` segments there are now."""
    try:
        return {n for n in os.listdir(SHM_DIR) if n.startswith(PREFIX)}
    except OSError:
        return set()


def created_since(before: Collection[str], t0: float) -> set[str]:
    """The ``psm_`` segments not in ``before`` made at or after ``t0`` (``time.time()``): what
    was made while a process started, whether or not anything still maps it."""
    found = set()
    for name in listing() - set(before):
        try:
            if os.stat(SHM_DIR / name).st_ctime >= t0 - 1.0:  # ctime's own granularity
                found.add(name)
        except OSError:
            continue
    return found


def release(names: Collection[str], exclude: Collection[int] = ()) -> list[str]:
    """Unlink each of ``names`` that no live process maps, not counting ``exclude`` (processes
    just killed, whose mappings may linger a moment); the names unlinked."""
    if not names:
        return []
    still = mapped_by(p for p in _pids() if p not in exclude)
    gone = []
    for name in names:
        if name.startswith(PREFIX) and "/" not in name and name not in still:
            with contextlib.suppress(FileNotFoundError):
                (SHM_DIR / name).unlink()
                gone.append(name)
    return gone


__all__ = [
    "SHM_DIR",
    "PREFIX",
    "group_members",
    "descendants",
    "mapped_by",
    "listing",
    "created_since",
    "release",
]
