"""The simulator's compiled pieces, built once per machine (``interlock.cbuild``): the simulated
worker's block map (``csrc/simpool.c``, ``SimPool``'s keys, references and LRU order, a CPython
extension module, which also computes a decode stretch's step ends and times with the EMA, the
same doubles as ``SimWorker``'s Python) and the cache bounds' LRU walk (``csrc/pooled_lru.c``,
through ctypes).

A replay stores, references, frees and evicts every block of every request: on the conversation
trace about 6 M dict operations, a quarter of a replay's time in Python. The extension takes a
request's or a step's keys in one call. ``load()`` returns the module, or None where it cannot be
built or with ``INTERLOCK_CPU_KERNELS=0``: ``SimPool`` then keeps a dict and an ``OrderedDict``,
the reference (``tests/sim/test_pool.py`` runs both on the same operations).
"""

from __future__ import annotations

import ctypes
import logging
import sysconfig
import threading
from functools import cache
from pathlib import Path
from types import ModuleType

from interlock import cbuild

log = logging.getLogger(__name__)

NAME = "interlock_simpool"
SOURCE = Path(__file__).with_name("csrc") / "simpool.c"
CFLAGS = (
    "-O2",
    "-ffp-contract=off",
    "-fno-fast-math",
    "-shared",
    "-fPIC",
    f"-I{sysconfig.get_paths()['include']}",
    f"-DINTERLOCK_SOABI={sysconfig.get_config_var('SOABI')}",
)
"""With this Python's headers; the ABI tag keys the cached build to the interpreter."""
_lock = threading.Lock()


@cache
def load() -> ModuleType | None:
    """The compiled module, or None (see the module note)."""
    if not cbuild.enabled():
        return None
    with _lock:
        try:
            module = cbuild.load_extension(SOURCE, CFLAGS, NAME)
        except Exception as exc:  # any compiler or loader failure: the dicts, say why once
            log.warning("compiled simulator pool unavailable, keeping blocks in dicts: %s", exc)
            return None
    return module


BOUNDS_SOURCE = Path(__file__).with_name("csrc") / "pooled_lru.c"
BOUNDS_CFLAGS = ("-O2", "-shared", "-fPIC")


@cache
def load_bounds() -> ctypes.CDLL | None:
    """The bounds' walk (``sim.bounds``), or None where it cannot be built."""
    if not cbuild.enabled():
        return None
    with _lock:
        try:
            lib = ctypes.CDLL(str(cbuild.build(BOUNDS_SOURCE, BOUNDS_CFLAGS, "pooled_lru")))
        except Exception as exc:  # any compiler or loader failure: the Python walk
            log.warning("compiled cache bounds unavailable, walking in Python: %s", exc)
            return None
    c = ctypes
    lib.pooled_lru_leading.argtypes = [c.c_void_p, c.c_void_p, c.c_int64, c.c_int64, c.c_void_p]
    lib.pooled_lru_leading.restype = c.c_int64
    return lib


def main() -> int:
    """Build both ahead (``scripts/setup.sh``), so no replay waits for the compiler."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    pool, walk = load() is not None, load_bounds() is not None
    print(
        f"simulator: pool {'compiled' if pool else 'in dicts'}, bounds {'compiled' if walk else 'in Python'}"
    )
    return 0
