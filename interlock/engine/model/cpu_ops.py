"""Fused bf16 CPU kernels (``csrc/cpu_ops.cpp``), compiled once per machine and cached.

``load()`` returns the ops, or None where they cannot be used: no AVX-512 BF16 in the CPU,
no C++ compiler, a failed build, or ``INTERLOCK_CPU_KERNELS=0``. The model then runs its
plain PyTorch path, which computes the same function. The build (about 15 s on two cores)
happens on first use; ``scripts/setup.sh`` runs it ahead (``cpu_ops.main()``) so that no
server or test waits for a compiler. The build folder is keyed by a hash of the source, the
compiler flags, torch's and Python's versions, so an edited kernel or a new torch is rebuilt,
never mixed up.

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

SOURCE = Path(__file__).with_name("csrc") / "cpu_ops.cpp"
CFLAGS = ("-O3", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512bf16", "-mfma")
_lock = threading.Lock()


def cpu_supports_bf16_kernels() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    needed = ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16")
    return all(f" {flag}" in flags for flag in needed)


def build_dir() -> Path:
    key = hashlib.sha256(SOURCE.read_bytes())
    key.update(" ".join(CFLAGS).encode())
    key.update(torch.__version__.encode())
    key.update(sys.version.encode())
    return get_env().cache_dir / "cpu_ops" / key.hexdigest()[:16]


@cache
def load() -> object | None:
    """``torch.ops.interlock`` with the fused kernels loaded, or None (see the module note)."""
    if not get_env().cpu_kernels or not cpu_supports_bf16_kernels():
        return None
    with _lock:
        try:
            _build_and_load()
        except Exception as exc:  # any compiler or loader failure: fall back, say why once
            log.warning("fused CPU kernels unavailable, using the plain PyTorch path: %s", exc)
            return None
    return torch.ops.interlock


def _build_and_load() -> None:
    from torch.utils import cpp_extension

    folder = build_dir()
    folder.mkdir(parents=True, exist_ok=True)
    library = folder / "interlock_cpu_ops.so"
    if library.exists():
        torch.ops.load_library(str(library))
        return
    # The ninja of the virtual environment (pip package) when the system has none.
    venv_bin = str(Path(sys.executable).parent)
    if shutil.which("ninja") is None and venv_bin not in os.environ.get("PATH", ""):
        os.environ["PATH"] = venv_bin + os.pathsep + os.environ.get("PATH", "")
    log.info("compiling the fused CPU kernels once into %s (about 15 s)", folder)
    # Build in a folder of this process and rename the library into place: a process that
    # starts meanwhile either finds no library (and builds too) or a complete one.
    scratch = folder / f"build-{os.getpid()}-{threading.get_ident()}"
    scratch.mkdir(exist_ok=True)
    try:
        cpp_extension.load(
            name="interlock_cpu_ops",
            sources=[str(SOURCE)],
            extra_cflags=list(CFLAGS),
            extra_ldflags=["-fopenmp"],
            build_directory=str(scratch),
            is_python_module=False,
            verbose=False,
        )
        os.replace(scratch / "interlock_cpu_ops.so", library)
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
    ops = load()
    if ops is None:
        print("fused CPU kernels: not used on this machine (plain PyTorch path)")
        return 0
    print(f"fused CPU kernels: ready ({build_dir()})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
