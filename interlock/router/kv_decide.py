"""The ``kv`` decision behind one interface: given a request's block hashes and the workers it
may go to, every worker's cost, the best few and the choice (``KvDecider``).

Two implementations, chosen once when the router is built:

- ``ReferenceDecider`` (here): the definition, written to be read. Look up how many leading
  blocks of the prompt each worker holds (``KvIndexer.overlaps``, and in lower tiers), price
  every worker with ``cost.ttft_costs``, rank the cheapest with ``cost.cheapest`` and choose
  with ``cost.choose``.
- ``route_kernel.CompiledDecider``: the same decisions in one compiled pass (``csrc/``), which
  alone owns the ctypes packing, the field-order contracts with the C and the fingerprint that
  switches it off when ``cost.py`` changes. It falls back to this reference for what it does not
  compute (a choice among NaN costs).

The contract between them: every decision identical, costs to the last bit, on randomized
states and on whole replays (``tests/router/test_kv_decide.py``, ``test_route_kernel.py``,
``benchmarks/router_same_choices.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import msgspec
import numpy as np

from interlock.router.cost import CostParams, cheapest, choose, ttft_costs
from interlock.router.indexer import KvIndexer
from interlock.router.kv_lookup import KvLookup
from interlock.router.load import LoadTracker


class KvRequest(msgspec.Struct, frozen=True, gc=False):
    """One request to place, as the decision sees it (a ``msgspec.Struct``, as ``Decision``: a
    named tuple took 0.3 µs to build, this 0.03)."""

    hashes: Sequence[int]
    """The prompt's block hashes, in order."""
    prompt_tokens: int
    max_tokens: int
    mask: np.ndarray
    """The slots it may go to (bool, one per slot of the index)."""
    whole: bool
    """``mask`` holds every slot (nothing to mask out of the ranking)."""
    weight: np.ndarray | None
    """Per-slot routing weights in (0, 1] (costs are divided by them), None when all are 1."""
    rotation: int
    """Breaks ties that remain after the least-busy rule."""
    fleet: int
    """Registered workers, whatever their health or role: the fleet's mean backlog is over them."""
    lookup: KvLookup | None = None
    """The prefix lookup a replica made (a frontend without an index, ``kv_lookup.py``), used
    in place of the index's; None: look up in the index."""


class KvChoice(msgspec.Struct, frozen=True, gc=False):
    costs: np.ndarray
    """Every slot's cost (seconds to first token, over its weight); may be a view of a buffer
    the decider's next call overwrites."""
    ranked: list[int]
    """Up to ``k`` eligible slots with finite costs, cheapest first."""
    slot: int
    """The chosen slot."""
    held: Callable[[int], int]
    """Leading device blocks of the prompt that a slot holds."""


class KvDecider(Protocol):
    name: str
    """``reference`` or ``compiled``."""

    def decide(self, req: KvRequest) -> KvChoice:
        """Cost every slot, rank and choose among ``req.mask`` (which has an eligible slot)."""
        ...


class ReferenceDecider:
    """The ``kv`` decision in numpy: the definition the compiled one is held to."""

    name = "reference"

    def __init__(
        self,
        indexer: KvIndexer,
        load: LoadTracker,
        params: CostParams,
        k: int,
        rng: np.random.Generator,
    ) -> None:
        self.indexer, self.load, self.params = indexer, load, params
        self.k = k
        """Candidates ranked (two at least: ``choose`` looks at the second for ties)."""
        self.rng = rng

    def decide(self, req: KvRequest) -> KvChoice:
        n = len(req.mask)
        if req.lookup is not None:
            overlaps = req.lookup.device
        else:
            overlaps = self.indexer.overlaps(req.hashes, n) if req.hashes else np.zeros(n, dtype=np.int32)
        costs = self.costs(req, overlaps)
        if req.weight is not None:
            costs = costs / req.weight
        return self.choose(req, costs, overlaps.item)

    def costs(self, req: KvRequest, overlaps: np.ndarray) -> np.ndarray:
        """``ttft_costs`` of every slot from the load tracker's vectors (``cost.py`` has the
        formula), plus the wait for weights a worker offloaded while idle (``cost.py``,
        "Weights out")."""
        costs = self._ttft_costs(req, overlaps)
        waits = self.load.weights_waits()
        return costs if waits is None else costs + waits[: len(costs)]

    def _ttft_costs(self, req: KvRequest, overlaps: np.ndarray) -> np.ndarray:
        n, load, params = len(overlaps), self.load, self.params
        overhead, per_token = load.speeds()
        decode_step = load.decode_step()[:n]
        if req.lookup is not None:
            lower = req.lookup.lower
        else:
            lower = self.indexer.lower_overlaps(req.hashes, n) if self.indexer.has_lower_tiers() else None
        room = {}
        if params.price_room:
            used, free = load.blocks_in_use()
            room = {
                "free_blocks": free[:n],
                "used_blocks": used[:n],
                "drain_s": decode_step * max(req.max_tokens, 1),
            }
        return ttft_costs(
            params,
            prompt_tokens=req.prompt_tokens,
            overlap_blocks=overlaps,
            lower_blocks=lower,
            load_s_per_block=load.load_s_per_block[:n] if lower is not None else None,
            queued_prefill=load.queued_prefill()[:n],
            per_token_s=per_token[:n],
            step_overhead_s=overhead[:n],
            decode_step_s=decode_step,
            kv_usage=load.kv_used_frac[:n],
            decode_tokens=req.max_tokens,
            waiting=load.reported_waiting[:n],
            decoding=load.stalled(params.stall_over)[:n],
            backlog_workers=req.fleet,
            **room,
        )

    def choose(self, req: KvRequest, costs: np.ndarray, held: Callable[[int], int]) -> KvChoice:
        """Rank the cheapest eligible slots and choose among them (``cost.choose``: ties to the
        least busy, then by rotation; sampled at a temperature above 0)."""
        n = len(costs)
        ranked = cheapest(costs, None if req.whole else req.mask, self.k)
        slot = choose(
            costs,
            req.mask,
            self.load.busy()[:n],
            tolerance=self.params.tie_tolerance_s,
            temperature=self.params.temperature,
            rng=self.rng,
            rotation=req.rotation,
            ranked=ranked,
        )
        return KvChoice(costs, ranked, slot, held)
