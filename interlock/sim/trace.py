"""Request traces for replay: the common ``SimRequest`` shape, and Mooncake traces as requests.

Loading, arrival speed-up and the expansion of hash ids into tokens are ``interlock.mooncake``'s
(shared with ``interlock bench``); here the token indices are token ids over ``VOCAB_SIZE``, and
the simulator's workers and the router hash them with ``interlock.kvhash`` at their own block
size (64 here, as in Dynamo's replay), like a real deployment would.

Hashing every request's tokens is the slow part of loading a trace (145 M tokens for the
conversation trace), so ``TraceHasher`` memoises: an id always has the same predecessor, hence
the kvhash of each of its sub-blocks is a function of the id alone.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import cast

from interlock.kvchain import hash_blocks, trace_hash_chain
from interlock.kvhash import ROOT_PARENT
from interlock.mooncake import (
    GOLDEN,
    TRACE_BLOCK_SIZE,
    MooncakeRecord,
    arrival_offsets,
    blocks_indices,
    prompt_indices,
)

log = logging.getLogger(__name__)

VOCAB_SIZE = 49152


@dataclass(frozen=True, slots=True)
class SimRequest:
    request_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    block_hashes: tuple[int, ...]
    """kvhash of each full block of the prompt, at the replay's block size."""
    session_id: str | None = None
    priority: int = 0
    token_ids: tuple[int, ...] | None = None
    """The prompt itself; only kept when a replay needs real tokens (the engine backend)."""


class TraceHasher:
    """kvhash chains of trace records at ``block_size``, memoised per trace hash id."""

    def __init__(self, block_size: int = 64, trace_block_size: int = TRACE_BLOCK_SIZE) -> None:
        if trace_block_size % block_size:
            raise ValueError("trace block size must be a multiple of the replay block size")
        self.block_size = block_size
        self.trace_block_size = trace_block_size
        self._memo: dict[int, tuple[int, ...]] = {}

    def hashes(self, rec: MooncakeRecord, index: int = 0) -> tuple[int, ...]:
        """The prompt's block hashes (``index``: the record's number, for a prompt longer than
        its hash ids, whose padding is unique to it)."""
        n_full = rec.input_length // self.block_size
        if len(rec.hash_ids) * self.trace_block_size < n_full * self.block_size:
            tokens = prompt_indices(rec, index, VOCAB_SIZE, self.trace_block_size)
            return tuple(hash_blocks(cast(Sequence[int], tokens), self.block_size))
        needed = rec.hash_ids[: -(-n_full * self.block_size // self.trace_block_size)]
        out: list[int] = []
        parent = ROOT_PARENT
        i = 0
        while i < len(needed):
            got = self._memo.get(needed[i])
            if got is None:
                got = self._new_run(needed, i, parent)
            out.extend(got)
            parent = out[-1]
            i += len(got) * self.block_size // self.trace_block_size
        return tuple(out[:n_full])

    def _new_run(self, ids: Sequence[int], start: int, parent: int) -> tuple[int, ...]:
        """Hashes of the run of not yet memoised ids from ``start``, each chained after the one
        before (``parent`` before the first): their tokens in one vectorised call, their hashes
        in one chained call (``kvchain``); each id's share memoised."""
        run: list[int] = []
        for hid in ids[start:]:
            if hid in self._memo or hid in run:
                break
            run.append(hid)
        hs = None
        if _compiled_trace_hashes():
            hs = trace_hash_chain(run, self.trace_block_size, GOLDEN, VOCAB_SIZE, self.block_size, parent)
        if hs is None:
            tokens = blocks_indices(run, VOCAB_SIZE, self.trace_block_size)
            hs = hash_blocks(cast(Sequence[int], tokens), self.block_size, parent)
        per = self.trace_block_size // self.block_size
        for k, hid in enumerate(run):
            self._memo[hid] = tuple(hs[k * per : (k + 1) * per])
        return tuple(hs)


@cache
def _compiled_trace_hashes() -> bool:
    """``kvchain.trace_hash_chain`` gives what ``blocks_indices`` then ``hash_blocks`` give, on a
    sample (ids near 2**64 included, at three block sizes): then it hashes traces, in C."""
    rng = random.Random(0x7ACE)
    ids = [0, 1, (1 << 64) - 1, *(rng.randrange(1 << 64) for _ in range(5))]
    for block_size in (16, 64, 512):
        parent = rng.randrange(1 << 64)
        got = trace_hash_chain(ids, TRACE_BLOCK_SIZE, GOLDEN, VOCAB_SIZE, block_size, parent)
        if got is None:
            return False
        tokens = blocks_indices(ids, VOCAB_SIZE, TRACE_BLOCK_SIZE)
        if got != hash_blocks(cast(Sequence[int], tokens), block_size, parent):
            log.warning("compiled trace hashing disagrees with mooncake's expansion: hashing in numpy")
            return False
    return True


def mooncake_requests(
    records: Sequence[MooncakeRecord],
    *,
    block_size: int = 64,
    speedup: float = 1.0,
    hasher: TraceHasher | None = None,
    with_tokens: bool = False,
) -> list[SimRequest]:
    """Trace records as ``SimRequest``s, arrivals at ×``speedup`` (``mooncake.arrival_offsets``)."""
    hasher = hasher or TraceHasher(block_size)
    tbs = hasher.trace_block_size
    return [
        SimRequest(
            f"r{i}",
            t,
            r.input_length,
            max(r.output_length, 1),
            hasher.hashes(r, i),
            token_ids=tuple(prompt_indices(r, i, VOCAB_SIZE, tbs).tolist()) if with_tokens else None,
        )
        for i, (r, t) in enumerate(zip(records, arrival_offsets(records, speedup), strict=True))
    ]
