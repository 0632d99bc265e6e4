"""Fused bf16 CPU kernels (``csrc/cpu_ops.cpp``), compiled once per machine and cached.

``load()`` returns the ops, or None where they cannot be used: no AVX-512 BF16 in the CPU,
no C++ compiler, a failed build, or ``INTERLOCK_CPU_KERNELS=0``. The model then runs its
plain PyTorch path, which computes the same function. The build (about 15 s on two cores)
happens on first use; ``scripts/setup.sh`` runs it ahead (``cpu_ops.main()``) so that no
server or test waits for a compiler. The build folder is keyed by a hash of the source, the
compiler flags, torch's and Python's versions, so an edited kernel or a new torch is rebuilt,
never mixed up.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sys
import threading
from functools import cache
from pathlib import Path

import torch

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


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ops = load()
    if ops is None:
        print("fused CPU kernels: not used on this machine (plain PyTorch path)")
        return 0
    print(f"fused CPU kernels: ready ({build_dir()})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
