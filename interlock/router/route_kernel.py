"""The ``kv`` decision compiled (``csrc/route_kv.c``): cost over every worker, ranked
candidates and choice in one pass, bit-identical to ``cost.ttft_costs`` + ``cost.cheapest`` +
``cost.choose`` at temperature 0 (the numpy path, which stays the reference and the fallback).

Over 1,024 workers the numpy path makes about twenty calls over 1,024-long vectors, each a few
microseconds of dispatch for a few hundred nanoseconds of arithmetic; the kernel makes one
pass. Plain C, built once per machine with the system compiler (``interlock.cbuild``) and
called through ctypes. ``load()`` returns None where it cannot be built (no ``cc``) or with
``INTERLOCK_CPU_KERNELS=0``; the router then decides with numpy, the same decisions. A sampled
choice (``temperature`` > 0) always uses numpy.

ctypes reads an array's address in about a microsecond, so ``RouteKernel`` remembers the
addresses of the arrays it was given (the router's vectors live as long as the router; a
view made per call, ``a[:n]``, is a new object each time): callers pass whole vectors and
the number of workers.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from functools import cache
from pathlib import Path

import numpy as np

from interlock import cbuild
from interlock.router.cost import CostParams

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("csrc") / "route_kv.c"
CFLAGS = ("-O2", "-ffp-contract=off", "-fno-fast-math", "-shared", "-fPIC")
"""No fused multiply-add, no reassociation: the numpy path's rounding, step by step."""
MAX_RANKED = 64
"""The most candidates the kernel ranks (``RouterConfig.num_candidates`` above it: numpy)."""
_i64, _f64, _ptr = ctypes.c_int64, ctypes.c_double, ctypes.c_void_p
_ARGS = (
    (_i64,)  # n
    + (_ptr,) * 4  # uncached, queued, per_token, overhead
    + (_f64, _f64, _ptr)  # chunk, miss_weight, waiting
    + (_ptr, _f64)  # decode_step, decode_scale
    + (_ptr, _ptr)  # lower, load_s
    + (_ptr, _f64, _f64, _f64)  # kv_usage, kv_penalty, watermark, watermark_span
    + (_ptr, _ptr, _f64, _f64)  # free, used, drain_scale, block_size
    + (_ptr, _ptr, _ptr)  # weight, eligible, busy
    + (_f64, _i64, _i64)  # tolerance, rotation, k
    + (_ptr,) * 4  # cost, scratch, ranked, num_ranked
)
_MAX_REMEMBERED = 64
_lock = threading.Lock()


@cache
def load() -> ctypes.CDLL | None:
    """The compiled kernel's library, or None (see the module note)."""
    if not cbuild.enabled():
        return None
    with _lock:
        try:
            lib = ctypes.CDLL(str(cbuild.build(SOURCE, CFLAGS, "route_kv")))
        except Exception as exc:  # any compiler or loader failure: fall back, say why once
            log.warning("compiled routing kernel unavailable, deciding with numpy: %s", exc)
            return None
    lib.route_kv.argtypes = _ARGS
    lib.route_kv.restype = _i64
    return lib


class RouteKernel:
    """One router's calls into the kernel, with its output buffers and remembered addresses."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._fn = lib.route_kv
        self._addr: dict[int, tuple[np.ndarray, int]] = {}
        self._cost = np.zeros(0)
        self._scratch = np.zeros(0)
        self._ranked = np.zeros(MAX_RANKED, dtype=np.int64)
        self._num_ranked = np.zeros(1, dtype=np.int64)
        self._ranked_at = self._ranked.ctypes.data
        self._num_at = self._num_ranked.ctypes.data
        self._n = 0

    def _at(self, a: np.ndarray | None) -> int | None:
        """The address of ``a``'s first element (None for None); ``a`` is float64 or bool and
        contiguous (else TypeError: the caller's bug, not a reason to compute anything else)."""
        if a is None:
            return None
        if len(a) < self._n:
            raise ValueError(f"route kernel needs {self._n} workers' values, got {len(a)}")
        seen = self._addr.get(id(a))
        if seen is not None and seen[0] is a:
            return seen[1]
        if not a.flags.c_contiguous or a.dtype not in (np.float64, np.bool_) or a.ndim != 1:
            raise TypeError(f"route kernel needs contiguous float64 or bool vectors, got {a.dtype}")
        if len(self._addr) >= _MAX_REMEMBERED:
            self._addr.clear()
        at = a.ctypes.data
        self._addr[id(a)] = (a, at)
        return at

    def decide(
        self,
        params: CostParams,
        n: int,
        *,
        uncached: np.ndarray,
        queued: np.ndarray,
        per_token: np.ndarray,
        overhead: np.ndarray,
        decode_step: np.ndarray,
        decode_tokens: int,
        kv_usage: np.ndarray,
        busy: np.ndarray,
        k: int,
        rotation: int,
        waiting: np.ndarray | None = None,
        lower: np.ndarray | None = None,
        load_s: np.ndarray | None = None,
        free: np.ndarray | None = None,
        used: np.ndarray | None = None,
        drain_tokens: int = 0,
        weight: np.ndarray | None = None,
        eligible: np.ndarray | None = None,
    ) -> tuple[np.ndarray, list[int], int]:
        """``(costs, ranked, slot)`` for the first ``n`` workers: ``ttft_costs`` (divided by
        ``weight`` if given), ``cheapest(costs, eligible, k)`` and ``choose`` at temperature 0,
        -1 for the slot where numpy must choose (no eligible worker with a finite cost, or a
        NaN cost; ``ranked`` is then empty). Vectors are read up to ``n`` (they may be longer);
        the wait for room is priced when ``free`` and ``used`` are given, draining in
        ``decode_step * drain_tokens``. ``costs`` is a view of a buffer the next call
        overwrites."""
        if not 0 < k <= MAX_RANKED:
            raise ValueError(f"k must be in 1..{MAX_RANKED}, got {k}")
        self._n = n
        if len(self._cost) < n:
            self._cost = np.zeros(max(n, 2 * len(self._cost)))
            self._scratch = np.zeros(len(self._cost))
        at = self._at
        room = free is not None and used is not None
        slot = self._fn(
            n,
            at(uncached),
            at(queued),
            at(per_token),
            at(overhead),
            float(params.chunk_tokens),
            params.miss_weight,
            at(waiting),
            at(decode_step),
            params.decode_weight * decode_tokens if params.decode_weight and decode_tokens else 0.0,
            at(lower) if load_s is not None else None,
            at(load_s) if lower is not None else None,
            at(kv_usage),
            params.kv_penalty,
            params.kv_watermark,
            max(1.0 - params.kv_watermark, 1e-9),
            at(free) if room else None,
            at(used) if room else None,
            float(max(drain_tokens, 1)),
            float(params.block_size),
            at(weight),
            at(eligible),
            at(busy),
            params.tie_tolerance_s,
            rotation,
            k,
            at(self._cost),
            at(self._scratch),
            self._ranked_at,
            self._num_at,
        )
        ranked = self._ranked[: int(self._num_ranked[0])].tolist() if slot >= 0 else []
        return self._cost[:n], ranked, int(slot)
