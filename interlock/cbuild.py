"""Small C kernels built at run time with the system compiler and loaded through ctypes (or
imported, as CPython extension modules: ``load_extension``).

``build(source, cflags, name)`` compiles one C file into a shared library once per machine:
the folder (``<cache_dir>/<name>/<key>``) is keyed by a hash of the source, the flags and the
machine type, so an edited kernel is rebuilt, never mixed up with an old one. A process builds
under a name of its own and renames the library into place: one that starts meanwhile finds
either no library (and builds too) or a complete one. Callers fall back to their numpy path
where this raises (no ``cc``, a failed build) or where ``enabled()`` is False
(``INTERLOCK_CPU_KERNELS=0``).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import platform
import shutil
import subprocess
import threading
from pathlib import Path
from types import ModuleType

from interlock.env import get_env


def enabled() -> bool:
    """Compiled kernels are allowed (``INTERLOCK_CPU_KERNELS`` is not 0)."""
    return get_env().cpu_kernels


def build_dir(source: Path, cflags: tuple[str, ...], name: str, depends: tuple[Path, ...] = ()) -> Path:
    """The library's folder, keyed by the source, the files it includes (``depends``), the
    flags and the machine type."""
    key = hashlib.sha256(source.read_bytes())
    for dep in depends:
        key.update(dep.read_bytes())
    key.update(" ".join(cflags).encode())
    key.update(platform.machine().encode())
    return get_env().cache_dir / name / key.hexdigest()[:16]


def build(source: Path, cflags: tuple[str, ...], name: str, depends: tuple[Path, ...] = ()) -> Path:
    """The shared library ``lib<name>.so`` built from ``source`` (cached; see the module note;
    ``depends``: files the source includes, part of the key). Raises RuntimeError when there
    is no compiler or the build fails."""
    folder = build_dir(source, cflags, name, depends)
    library = folder / f"lib{name}.so"
    if library.exists():
        return library
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler (cc) on PATH")
    folder.mkdir(parents=True, exist_ok=True)
    scratch = folder / f"lib{name}-{os.getpid()}-{threading.get_ident()}.so"
    try:
        subprocess.run(
            [compiler, *cflags, str(source), "-o", str(scratch)],
            check=True,
            capture_output=True,
            text=True,
            timeout=120,
        )
        os.replace(scratch, library)
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(f"{compiler} failed: {exc.stderr.strip()[-500:]}") from exc
    finally:
        scratch.unlink(missing_ok=True)
    return library


def load_extension(
    source: Path, cflags: tuple[str, ...], name: str, depends: tuple[Path, ...] = ()
) -> ModuleType:
    """Build ``source`` as the CPython extension module ``name`` (``build``; ``cflags`` carry
    this Python's headers) and import it. Raises where ``build`` does, or the import fails."""
    path = build(source, cflags, name, depends)
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module
