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

import ast
import ctypes
import dataclasses
import hashlib
import inspect
import logging
import textwrap
import threading
from collections.abc import Callable, Sequence
from functools import cache, partial
from pathlib import Path

import numpy as np

from interlock import cbuild
from interlock.router import cost
from interlock.router.cost import CostParams, uncached_tokens_of
from interlock.router.indexer import KvIndexer, fill_by_depth, overlap_of
from interlock.router.kv_decide import KvChoice, KvRequest, ReferenceDecider

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("csrc") / "route_kv.c"
CFLAGS = ("-O3", "-ffp-contract=off", "-fno-fast-math", "-fno-trapping-math", "-shared", "-fPIC")
"""No fused multiply-add, no reassociation: the numpy path's rounding, step by step
(``-fno-trapping-math`` only lets the AVX2 first pass vectorise ``ceil``; no value changes)."""
MAX_RANKED = 64
"""The most candidates the kernel ranks (``RouterConfig.num_candidates`` above it: numpy)."""
_PACKED = (ctypes.c_void_p,) * 3
"""``route_kv_packed``: int64 addresses, doubles, int64s, in ``route_kv``'s order (``decide``;
the int64s: n, rotation, k, backlog_charge, fleet, idle_replicas; what was added since at the end
of each)."""
_MAX_REMEMBERED = 64
_lock = threading.Lock()


MIRRORED = "7eabb0868ddf7b2c"
"""``cost_fingerprint()`` of the cost code ``route_kv.c`` mirrors. Where ``cost.py`` changes
(a new term, a new weight), the compiled decision is switched off (``mirrors_cost``) until
``route_kv.c`` is brought in line and this updated: the router then decides with numpy, never
with a cost that differs from the reference. ``tests/router/test_route_kernel.py`` fails
meanwhile, to say so."""
_MIRRORED_PARAMS = frozenset(
    {
        "block_size",
        "chunk_tokens",
        "kv_watermark",
        "kv_penalty",
        "miss_weight",
        "decode_weight",
        "stall_weight",
        "backlog_charge",
        "idle_replicas",
        "temperature",
        "tie_tolerance_s",
        "price_room",
        "stall_over",  # which vector the router passes as ``decoding``: read in Python
    }
)
"""The ``CostParams`` fields the compiled decision reads or checks (all of them)."""


def cost_fingerprint() -> str:
    """A hash of the code (docstrings left out) of ``cost.ttft_costs`` and the terms it adds
    up (``_uncached``, ``_prefill_s``, ``_idle_replicas``, ``_stall_s``, ``_room_wait``), ``cheapest`` and
    ``choose``, and of ``CostParams``' fields."""
    digest = hashlib.sha256()
    for fn in (
        cost.ttft_costs,
        cost._uncached,
        cost._prefill_s,
        cost._idle_replicas,
        cost._stall_s,
        cost._room_wait,
        cost.cheapest,
        cost.choose,
    ):
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
                if isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                    body.pop(0)
        digest.update(ast.dump(tree).encode())
    digest.update(" ".join(f.name for f in dataclasses.fields(cost.CostParams)).encode())
    return digest.hexdigest()[:16]


@cache
def mirrors_cost() -> bool:
    """The compiled decision computes what ``cost.py`` does (see ``MIRRORED``); says once why
    not."""
    names = {f.name for f in dataclasses.fields(cost.CostParams)}
    if names != _MIRRORED_PARAMS or cost_fingerprint() != MIRRORED:
        log.warning(
            "router/cost.py changed since csrc/route_kv.c mirrored it (fingerprint %s, mirrored %s):"
            " deciding with numpy until the kernel is brought in line",
            cost_fingerprint(),
            MIRRORED,
        )
        return False
    return True


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
    lib.route_kv_packed.argtypes = _PACKED
    lib.route_kv_packed.restype = ctypes.c_int64
    return lib


class RouteKernel:
    """One router's calls into the kernel, with its output buffers and remembered addresses.
    ``lib`` None: only ``decide_indexed`` (the kernel inside the compiled prefix index)."""

    def __init__(self, lib: ctypes.CDLL | None) -> None:
        self._fn = lib.route_kv_packed if lib is not None else None
        self._ptrs = np.zeros(19, dtype=np.int64)
        self._reals = np.zeros(10)
        self._ints = np.zeros(6, dtype=np.int64)
        self._args = (self._ptrs.ctypes.data, self._reals.ctypes.data, self._ints.ctypes.data)
        self._addr: dict[int, tuple[np.ndarray, int]] = {}
        self._cost = np.zeros(0)
        self._scratch = np.zeros(0)
        self._uncached = np.zeros(0)
        self._overlaps = np.zeros(0, dtype=np.int64)
        self._outs = (self._cost, self._scratch, self._uncached, self._overlaps)
        """``decide_indexed``'s output buffers, in ``decide``'s order."""
        self._ranked = np.zeros(MAX_RANKED, dtype=np.int64)
        self._num_ranked = np.zeros(1, dtype=np.int64)
        self._ranked_at = self._ranked.ctypes.data
        self._num_at = self._num_ranked.ctypes.data
        self._n = 0
        self._cost_at = self._scratch_at = 0
        self._params: CostParams | None = None
        self._consts: tuple[float, float, float, float, float, int, float, bool, float, bool] = (
            0.0, 0.0, 0.0, 0.0, 0.0, 0, 0.0, False, 0.0, False,
        )  # fmt: skip
        """``decide_indexed``'s cost constants, for ``_params``."""

    @property
    def has_library(self) -> bool:
        """``decide`` can be called (else only ``decide_indexed``)."""
        return self._fn is not None

    def _at(self, a: np.ndarray | None) -> int:
        """The address of ``a``'s first element (0 for None); ``a`` is float64 or bool and
        contiguous (else TypeError: the caller's bug, not a reason to compute anything else)."""
        if a is None:
            return 0
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
        decoding: np.ndarray | None = None,
        fleet: int | None = None,
    ) -> tuple[np.ndarray, list[int], int]:
        """``(costs, ranked, slot)`` for the first ``n`` workers: ``ttft_costs`` (divided by
        ``weight`` if given), ``cheapest(costs, eligible, k)`` and ``choose`` at temperature 0,
        -1 for the slot where numpy must choose (no eligible worker with a finite cost, or a
        NaN cost; ``ranked`` is then empty). Vectors are read up to ``n`` (they may be longer);
        the wait for room is priced when ``free`` and ``used`` are given, draining in
        ``decode_step * drain_tokens``; the stall of the worker's decodes with ``decoding``;
        the backlog's mean over ``fleet`` workers (``ttft_costs``' ``backlog_workers``; None: n).
        ``costs`` is a view of a buffer the next call
        overwrites."""
        if self._fn is None:
            raise TypeError("this RouteKernel has no library: only decide_indexed")
        self._n = n
        self._pack_numbers(params, n, decode_tokens, drain_tokens, k, rotation, n if fleet is None else fleet)
        self._pack_vectors(
            uncached, queued, per_token, overhead, waiting, decode_step, lower, load_s, kv_usage, free, used,
            weight, eligible, busy, decoding,
        )  # fmt: skip
        slot = self._fn(*self._args)
        ranked = self._ranked[: int(self._num_ranked[0])].tolist() if slot >= 0 else []
        return self._cost[:n], ranked, int(slot)

    def decide_indexed(
        self,
        indexer: KvIndexer,
        hashes: Sequence[int],
        params: CostParams,
        n: int,
        prompt_tokens: int,
        decode_tokens: int,
        drain_tokens: int,
        k: int,
        rotation: int,
        vectors: tuple[object, ...],
        weight: np.ndarray | None,
        eligible: np.ndarray | None,
        fleet: int,
    ) -> tuple[np.ndarray, list[int], int, np.ndarray]:
        """``decide`` with the uncached tokens worked out from the compiled prefix index's
        lookup of ``hashes`` in the same call (``KvIndexer.native_decide``, ``csrc/kvindex.c``;
        no lower tiers): ``(costs, ranked, slot, overlaps)``, ``overlaps`` the leading blocks
        each worker holds (int64). ``vectors`` are ``LoadTracker.cost_vectors``'s, in its
        order (the decode step a vector, or ``LoadTracker.decode_step_terms``); ``fleet`` as
        ``decide``'s (here given, 1..n). Arguments are positional: a call with twenty keywords cost 2 µs here.
        ``costs`` and ``overlaps`` are views of buffers the next call overwrites."""
        if params is not self._params or len(self._cost) < n:
            self._prepare(params, n)
        decide = indexer.native_decide
        if decide is None:
            raise TypeError("decide_indexed needs the compiled prefix index")
        slot, ranked = decide(
            hashes, self._consts, n, prompt_tokens, rotation, k, decode_tokens, drain_tokens,
            vectors, weight, eligible, self._outs, fleet,
        )  # fmt: skip
        cost, overlaps = self._cost, self._overlaps
        if len(cost) == n:  # no views to make (a view costs ~0.3 µs)
            return cost, ranked, slot, overlaps
        return cost[:n], ranked, slot, overlaps[:n]

    def _prepare(self, params: CostParams, n: int) -> None:
        """``decide_indexed``'s buffers for ``n`` workers and cost constants for ``params``."""
        self._grow(n)
        self._params = params
        self._consts = (
            float(params.chunk_tokens),
            params.miss_weight,
            params.decode_weight,
            params.kv_penalty,
            params.kv_watermark,
            params.block_size,
            params.tie_tolerance_s,
            params.backlog_charge,
            params.stall_weight,
            params.idle_replicas,
        )

    def _grow(self, n: int) -> None:
        if len(self._cost) >= n:
            return
        size = max(n, 2 * len(self._cost))
        self._cost, self._scratch, self._uncached = np.zeros(size), np.zeros(size), np.zeros(size)
        self._overlaps = np.zeros(size, dtype=np.int64)
        self._outs = (self._cost, self._scratch, self._uncached, self._overlaps)
        self._cost_at, self._scratch_at = self._cost.ctypes.data, self._scratch.ctypes.data

    def _pack_numbers(
        self,
        params: CostParams,
        n: int,
        decode_tokens: int,
        drain_tokens: int,
        k: int,
        rotation: int,
        fleet: int,
    ) -> None:
        """``route_kv_packed``'s doubles and int64s (``csrc/route_kv.c``), in its order (what was
        added since at the end of each)."""
        if not 0 < k <= MAX_RANKED:
            raise ValueError(f"k must be in 1..{MAX_RANKED}, got {k}")
        if n and not 0 < fleet <= n:
            raise ValueError(f"fleet must be in 1..{n} workers, got {fleet}")
        self._n = n
        self._grow(n)
        self._reals[:] = (
            params.chunk_tokens,
            params.miss_weight,
            params.decode_weight * decode_tokens if params.decode_weight and decode_tokens else 0.0,
            params.kv_penalty,
            params.kv_watermark,
            max(1.0 - params.kv_watermark, 1e-9),
            max(drain_tokens, 1),
            params.block_size,
            params.tie_tolerance_s,
            params.stall_weight,
        )
        self._ints[:] = (n, rotation, k, params.backlog_charge, fleet, params.idle_replicas)

    def _pack_vectors(
        self,
        uncached: np.ndarray,
        queued: np.ndarray,
        per_token: np.ndarray,
        overhead: np.ndarray,
        waiting: np.ndarray | None,
        decode_step: np.ndarray,
        lower: np.ndarray | None,
        load_s: np.ndarray | None,
        kv_usage: np.ndarray,
        free: np.ndarray | None,
        used: np.ndarray | None,
        weight: np.ndarray | None,
        eligible: np.ndarray | None,
        busy: np.ndarray,
        decoding: np.ndarray | None,
    ) -> None:
        """``route_kv_packed``'s addresses, in its order (arguments in that order too; the
        outputs in between, ``decoding`` added since at the end). Lower tiers need both of
        their vectors, the room both of its."""
        at = self._at
        tiers, room = lower is not None and load_s is not None, free is not None and used is not None
        self._ptrs[:] = (
            at(uncached), at(queued), at(per_token), at(overhead), at(waiting), at(decode_step),
            at(lower) if tiers else 0, at(load_s) if tiers else 0, at(kv_usage),
            at(free) if room else 0, at(used) if room else 0, at(weight), at(eligible), at(busy),
            self._cost_at, self._scratch_at, self._ranked_at, self._num_at, at(decoding),
        )  # fmt: skip


class CompiledDecider:
    """The ``kv`` decision compiled (``kv_decide.KvDecider``): lookup, cost, ranking and choice
    in one call into the compiled prefix index (``decide_indexed``) where the index is the
    compiled one and no worker has lower tiers; else the prefix lookup in Python and the rest in
    ``route_kv.c`` (``decide``). Where the kernel leaves the choice to numpy (NaN costs), the
    reference chooses among its costs. Built only where it decides as the reference does
    (``for_router``)."""

    name = "compiled"

    def __init__(self, kernel: RouteKernel, reference: ReferenceDecider) -> None:
        self.kernel, self.reference = kernel, reference
        self.indexer, self.load, self.params = reference.indexer, reference.load, reference.params
        self.k = reference.k
        self._uncached = np.zeros(0)
        """Scratch: the request's uncached prompt tokens per slot (``_fill_uncached``)."""

    @classmethod
    def for_router(cls, reference: ReferenceDecider) -> CompiledDecider | None:
        """The compiled decider where it is built, mirrors ``cost.py`` and can choose (at
        temperature 0, ranking at most ``MAX_RANKED``); None: the reference decides."""
        lib = load()
        if lib is None and not reference.indexer.compiled:
            return None
        if reference.params.temperature > 0 or reference.k > MAX_RANKED or not mirrors_cost():
            return None
        return cls(RouteKernel(lib), reference)

    def decide(self, req: KvRequest) -> KvChoice:
        if self.load.num_weights_out:  # a worker whose weights are out: priced by the reference
            return self.reference.decide(req)
        indexer = self.indexer
        if req.lookup is None and indexer.compiled and not indexer.has_lower_tiers():
            # lookup, cost, ranking and choice in one call (inline: a decision's budget is ~15 µs)
            params = self.params
            costs, ranked, slot, overlaps = self.kernel.decide_indexed(
                indexer, req.hashes, params, len(req.mask), req.prompt_tokens, req.max_tokens,
                req.max_tokens, self.k, req.rotation,
                self.load.cost_vectors(params.price_room, params.stall_over),
                req.weight, None if req.whole else req.mask, req.fleet,
            )  # fmt: skip
            held: Callable[[int], int] = overlaps.item
        elif self.kernel.has_library:
            costs, ranked, slot, held = self._decide_over_lookup(req)
        else:
            return self.reference.decide(req)
        if slot < 0:
            return self.reference.choose(req, costs, held)
        return KvChoice(costs, ranked, slot, held)

    def _decide_over_lookup(self, req: KvRequest) -> tuple[np.ndarray, list[int], int, Callable[[int], int]]:
        """The prefix lookup in Python, the rest in ``route_kv.c``. Whole vectors are passed
        (the kernel remembers their addresses) with the number of slots."""
        load, n, params = self.load, len(req.mask), self.params
        overhead, per_token = load.speeds()
        lower = None
        if req.lookup is not None:  # a replica's lookup (``kv_lookup.py``)
            overlaps, lower_blocks = req.lookup.device, req.lookup.lower
            uncached = uncached_tokens_of(params, req.prompt_tokens, overlaps, lower_blocks).astype(
                np.float64
            )
            lower = lower_blocks.astype(np.float64) if lower_blocks is not None else None
            held: Callable[[int], int] = overlaps.item
        elif self.indexer.has_lower_tiers():
            overlaps = self.indexer.overlaps(req.hashes, n) if req.hashes else np.zeros(n, dtype=np.int32)
            lower_blocks = self.indexer.lower_overlaps(req.hashes, n)
            uncached = uncached_tokens_of(params, req.prompt_tokens, overlaps, lower_blocks)
            uncached, lower = uncached.astype(np.float64), lower_blocks.astype(np.float64)
            held = overlaps.item
        else:
            runs = self.indexer.overlap_masks(req.hashes) if req.hashes else []
            self._fill_uncached(req.prompt_tokens, runs, n)
            uncached = self._uncached  # the whole vector (its address is remembered)
            held = partial(overlap_of, runs)
        used, free = load.blocks_in_use() if params.price_room else (None, None)
        costs, ranked, slot = self.kernel.decide(
            params,
            n,
            uncached=uncached,
            queued=load.queued_prefill(),
            per_token=per_token,
            overhead=overhead,
            decode_step=load.decode_step(),
            decode_tokens=req.max_tokens,
            kv_usage=load.kv_used_frac,
            busy=load.busy(),
            k=self.k,
            rotation=req.rotation,
            waiting=load.reported_waiting,
            lower=lower,
            load_s=load.load_s_per_block if lower is not None else None,
            free=free,
            used=used,
            drain_tokens=req.max_tokens,
            weight=req.weight,
            eligible=None if req.whole else req.mask,
            decoding=load.stalled(params.stall_over),
            fleet=req.fleet,
        )
        return costs, ranked, slot, held

    def _fill_uncached(self, prompt: int, runs: list[tuple[int, int]], n: int) -> np.ndarray:
        """The request's uncached tokens per slot, scattered straight from the lookup's runs
        (every worker outside them has the whole prompt to compute), in ``self._uncached``
        (a whole vector: the kernel remembers its address)."""
        if len(self._uncached) < n:
            self._uncached = np.zeros(max(n, 2 * len(self._uncached)))
        uncached = self._uncached[:n]
        bs = self.params.block_size
        table = [max(prompt, 1)]
        held = 0
        for _, length in runs:
            held += length
            table.append(max(prompt - held * bs, 1))
        fill_by_depth(uncached, runs, table)
        return uncached


def main() -> int:
    """Build the kernel ahead (``scripts/setup.sh``), so no router waits for the compiler."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if load() is None:
        print("routing kernel: not used on this machine (numpy decides)")
    else:
        print(f"routing kernel: ready ({cbuild.build_dir(SOURCE, CFLAGS, 'route_kv')})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
