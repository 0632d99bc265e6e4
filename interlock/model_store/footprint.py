"""What a loaded model's weights really hold in memory on this machine, measured once per model
and dtype setting, for placement to count instead of the weight files' size.

Interlock's CPU engine keeps each linear layer's weight in every layout its kernels use (one
per kernel a row range is served by, ``engine.model.linear``) and a packed copy of a tied
embedding for the output head: SmolLM2 in bf16 holds 532 MiB against 257 MiB of files. The
files' size alone undercounted two colocated models by 10% of their process's memory. The
engine records the bytes its model holds when it loads (``record``); placement reads them
(``measured``) and falls back to the files' size for a model never loaded here.

A JSON file in the cache directory, keyed by the model folder, the dtype setting and the CPU
(the kernel choice, hence the layouts, depends on it). A write is atomic (a rename); a file
that cannot be read counts as empty.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path

from interlock.env import get_env
from interlock.machine import cpu_info

FILE = "weights-footprints.json"


def record(folder: str | Path, dtype: str, nbytes: int) -> None:
    """The model at ``folder``, loaded with ``dtype`` (the setting, e.g. "auto"), holds
    ``nbytes`` of weights on this machine."""
    path = _path()
    entries = _read(path)
    key = _key(folder, dtype)
    if entries.get(key) == nbytes:
        return
    entries[key] = int(nbytes)
    with contextlib.suppress(OSError):  # a read-only cache: placement estimates instead
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".footprints-")
        with os.fdopen(fd, "w") as f:
            json.dump(entries, f, indent=1, sort_keys=True)
        os.replace(tmp, path)


def measured(folder: str | Path, dtype: str) -> int | None:
    """Bytes the model's weights held when it last loaded here with ``dtype``; None: never."""
    value = _read(_path()).get(_key(folder, dtype))
    return value if isinstance(value, int) and value > 0 else None


def _path() -> Path:
    return get_env().cache_dir / FILE


def _read(path: Path) -> dict[str, int]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _key(folder: str | Path, dtype: str) -> str:
    return f"{Path(folder).resolve()}|{dtype}|{cpu_info()[0]}"


__all__ = ["record", "measured"]
