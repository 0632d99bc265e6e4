"""The prefix index's map and the whole ``kv`` decision in C (``csrc/kvindex.c``), and the
dispatch accounting of one worker slot (``csrc/account.c``, ``LoadTracker``), loaded as a CPython
extension module built once per machine (``interlock.cbuild``).

Why an extension and not ctypes: a decision at 1,024 workers has a budget of about 50 µs, and a
ctypes call costs one or two of them before the C starts, and converting a prompt's 256 block
hashes to a C array in Python about eight more; the extension reads the Python list itself.

``load()`` returns the module, or None where it cannot be built (no ``cc``, no Python headers)
or with ``INTERLOCK_CPU_KERNELS=0``: ``KvIndexer`` then keeps its map in a Python dict and the
router decides with numpy, the same decisions (``tests/router/test_native.py``).
"""

from __future__ import annotations

import logging
import sysconfig
import threading
from functools import cache
from pathlib import Path
from types import ModuleType

import numpy as np

from interlock import cbuild

log = logging.getLogger(__name__)

NAME = "interlock_kvindex"
SOURCE = Path(__file__).with_name("csrc") / "kvindex.c"
DEPENDS = (SOURCE.with_name("route_kv.c"), SOURCE.with_name("account.c"))
CFLAGS = (
    "-O3",
    "-ffp-contract=off",
    "-fno-fast-math",
    "-fno-trapping-math",
    "-shared",
    "-fPIC",
    "-pthread",
    f"-I{sysconfig.get_paths()['include']}",
    f"-I{np.get_include()}",
    f"-DINTERLOCK_SOABI={sysconfig.get_config_var('SOABI')}",
    f"-DINTERLOCK_NUMPY={np.__version__}",
)
"""As ``route_kernel.CFLAGS`` (numpy's rounding, step by step), with this Python's and numpy's
headers; the two version tags key the cached build to the interpreter and numpy."""
_lock = threading.Lock()


@cache
def load() -> ModuleType | None:
    """The compiled module, or None (see the module note)."""
    if not cbuild.enabled():
        return None
    with _lock:
        try:
            module = cbuild.load_extension(SOURCE, CFLAGS, NAME, DEPENDS)
        except Exception as exc:  # any compiler or loader failure: fall back, say why once
            log.warning("compiled prefix index unavailable, routing in Python: %s", exc)
            return None
    return module


def main() -> int:
    """Build the module ahead (``scripts/setup.sh``), so no router waits for the compiler."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if load() is None:
        print("prefix index: the Python one on this machine (no compiled module)")
    else:
        print(f"prefix index: compiled ({cbuild.build_dir(SOURCE, CFLAGS, NAME, DEPENDS)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
