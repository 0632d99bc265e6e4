"""Fused CPU kernels (``csrc/cpu_ops.cpp`` for bf16, ``csrc/cpu_ops_f32.cpp`` for fp32),
compiled once per machine and cached.

Two libraries with the same operations, one per model dtype (``ops_for``):

* ``load()``: bf16 kernels for CPUs with AVX-512 BF16 (``torch.ops.interlock``), with the
  small-batch linear kernel besides;
* ``load_f32()``: fp32 kernels for CPUs with AVX2 and FMA (``torch.ops.interlock_f32``): norms,
  SwiGLU, rotary + KV store, paged attention, and a small-batch linear kernel over weights that
  are bf16 values, kept as bf16 (``linear.py``).

Each returns None where it cannot be used: the CPU lacks the instructions, no C++ compiler, a
failed build, or ``INTERLOCK_CPU_KERNELS=0``. The model then runs its plain PyTorch path, which
computes the same function. A build (about 15 s on two cores) happens on first use;
``scripts/setup.sh`` runs it ahead (``cpu_ops.main()``) so that no server or test waits for a
compiler. The build folder is keyed by a hash of the source and its headers, the compiler flags,
torch's and Python's versions, so an edited kernel or a new torch is rebuilt, never mixed up.

The block-copy kernel (``csrc/kv_copy.c``, ``load_copy()``) is separate: plain C for every
x86-64 CPU (SSE2), built in about a second with the system compiler and called through ctypes
(which releases the GIL for the call), so ``PagedKVCache`` uses it on machines without AVX-512
BF16 too. Where it cannot be built, or with ``INTERLOCK_CPU_KERNELS=0``, the cache copies
through numpy views instead (the same bytes, about half the bandwidth).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from interlock import cbuild
from interlock.env import get_env

log = logging.getLogger(__name__)

_lock = threading.Lock()


@dataclass(frozen=True)
class Library:
    """One fused-kernel library: its source, flags, the CPU flags it needs, its op namespace."""

    source: Path
    cflags: tuple[str, ...]
    needs: tuple[str, ...]
    """``/proc/cpuinfo`` flags the CPU must have."""
    namespace: str
    """``torch.ops.<namespace>`` (also the shared library's name)."""
    dtype: torch.dtype
    folder: str
    """Its builds' folder under the cache dir (also what its kernel tables are keyed by)."""


BF16 = Library(
    Path(__file__).with_name("csrc") / "cpu_ops.cpp",
    ("-O3", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512bf16", "-mfma"),
    ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"),
    "interlock",
    torch.bfloat16,
    "cpu_ops",
)
F32 = Library(
    Path(__file__).with_name("csrc") / "cpu_ops_f32.cpp",
    ("-O3", "-fopenmp", "-mavx2", "-mfma"),
    ("avx2", "fma"),
    "interlock_f32",
    torch.float32,
    "cpu_ops_interlock_f32",
)
LIBRARIES = (BF16, F32)


def cpu_supports(lib: Library) -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return all(f" {flag}" in flags for flag in lib.needs)


def cpu_supports_bf16_kernels() -> bool:
    return cpu_supports(BF16)


def build_dir(lib: Library = BF16) -> Path:
    key = hashlib.sha256(lib.source.read_bytes())
    for header in sorted(lib.source.parent.glob("*.h")):  # what the sources include
        key.update(header.read_bytes())
    key.update(" ".join(lib.cflags).encode())
    key.update(torch.__version__.encode())
    key.update(sys.version.encode())
    return get_env().cache_dir / lib.folder / key.hexdigest()[:16]


def load() -> object | None:
    """``torch.ops.interlock`` with the fused bf16 kernels loaded, or None (see the module note)."""
    return _load(BF16)


def load_f32() -> object | None:
    """``torch.ops.interlock_f32`` with the fused fp32 kernels loaded, or None."""
    return _load(F32)


def library_for(dtype: torch.dtype) -> Library | None:
    return next((lib for lib in LIBRARIES if lib.dtype == dtype), None)


def ops_for(dtype: torch.dtype) -> object | None:
    """The fused kernels for a model of ``dtype`` on this CPU, or None (the plain path)."""
    lib = library_for(dtype)
    return None if lib is None else _load(lib)


@cache
def _load(lib: Library) -> object | None:
    if not get_env().cpu_kernels or not cpu_supports(lib):
        return None
    with _lock:
        try:
            _build_and_load(lib)
        except Exception as exc:  # any compiler or loader failure: fall back, say why once
            log.warning(
                "fused CPU kernels (%s) unavailable, using the plain PyTorch path: %s", lib.namespace, exc
            )
            return None
    return getattr(torch.ops, lib.namespace)


def _build_and_load(lib: Library) -> None:
    from torch.utils import cpp_extension

    folder = build_dir(lib)
    folder.mkdir(parents=True, exist_ok=True)
    name = f"{lib.namespace}_cpu_ops"
    library = folder / f"{name}.so"
    if library.exists():
        torch.ops.load_library(str(library))
        return
    # The ninja of the virtual environment (pip package) when the system has none.
    venv_bin = str(Path(sys.executable).parent)
    if shutil.which("ninja") is None and venv_bin not in os.environ.get("PATH", ""):
        os.environ["PATH"] = venv_bin + os.pathsep + os.environ.get("PATH", "")
    log.info("compiling the fused CPU kernels (%s) once into %s (about 15 s)", lib.namespace, folder)
    # Build in a folder of this process and rename the library into place: a process that
    # starts meanwhile either finds no library (and builds too) or a complete one.
    scratch = folder / f"build-{os.getpid()}-{threading.get_ident()}"
    scratch.mkdir(exist_ok=True)
    try:
        cpp_extension.load(
            name=name,
            sources=[str(lib.source)],
            extra_cflags=list(lib.cflags),
            extra_ldflags=["-fopenmp"],
            build_directory=str(scratch),
            is_python_module=False,
            verbose=False,
        )
        os.replace(scratch / f"{name}.so", library)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


COPY_SOURCE = Path(__file__).with_name("csrc") / "kv_copy.c"
COPY_CFLAGS = ("-O2", "-shared", "-fPIC", "-pthread")
_i64, _ptr = ctypes.c_int64, ctypes.c_void_p
_COPY_ARGS = (_ptr, _i64, _i64, _i64, _ptr, _i64, _ptr)
"""cache, blocks in the cache, piece bytes, pieces per block, block ids (int64[n]), n, the
block-major buffer (``kv_import_each``: the address of each block, int64[n]); returns the
position of the first id out of range (nothing copied) or -1. See ``csrc/kv_copy.c``."""
_BETWEEN_ARGS = (_ptr, _i64, _ptr, _ptr, _i64, _i64, _i64, _ptr, _i64, _i64, _i64, _i64)
"""``kv_copy_between``: source cache, its blocks, source ids, our cache, our blocks, piece
bytes, pieces per block, our ids, n, the runs (pieces of a block) r0..r1-1 to copy, threads at
most; returns -1, k for a bad ids[k], n + k for a bad source id, 2n for a bad run range."""


@dataclass(frozen=True, slots=True)
class CopyKernel:
    """``kv_export`` / ``kv_import`` / ``kv_import_each`` of ``csrc/kv_copy.c``, arguments as in
    ``_COPY_ARGS``."""

    export: Callable[..., int]
    import_: Callable[..., int]
    import_each: Callable[..., int]
    between: Callable[..., int]
    """``kv_copy_between``, arguments as in ``_BETWEEN_ARGS``."""


def copy_build_dir() -> Path:
    return cbuild.build_dir(COPY_SOURCE, COPY_CFLAGS, "kv_copy")


@cache
def load_copy() -> CopyKernel | None:
    """The block-copy kernel, or None where it cannot be built or is switched off (see the
    module note)."""
    if not get_env().cpu_kernels:
        return None
    with _lock:
        try:
            lib = ctypes.CDLL(str(_build_copy()))
        except Exception as exc:  # any compiler or loader failure: fall back, say why once
            log.warning("KV block-copy kernel unavailable, copying through numpy: %s", exc)
            return None
    for fn in (lib.kv_export, lib.kv_import, lib.kv_import_each):
        fn.argtypes = _COPY_ARGS
        fn.restype = _i64
    lib.kv_copy_between.argtypes = _BETWEEN_ARGS
    lib.kv_copy_between.restype = _i64
    return CopyKernel(
        export=lib.kv_export,
        import_=lib.kv_import,
        import_each=lib.kv_import_each,
        between=lib.kv_copy_between,
    )


def _build_copy() -> Path:
    return cbuild.build(COPY_SOURCE, COPY_CFLAGS, "kv_copy")


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if load_copy() is None:
        print("KV block-copy kernel: not used on this machine (numpy copies)")
    else:
        print(f"KV block-copy kernel: ready ({copy_build_dir()})")
    for lib in LIBRARIES:
        what = f"fused {'bf16' if lib is BF16 else 'fp32'} CPU kernels"
        if _load(lib) is None:
            print(f"{what}: not used on this machine (plain PyTorch path)")
        else:
            print(f"{what}: ready ({build_dir(lib)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
