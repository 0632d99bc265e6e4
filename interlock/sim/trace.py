"""Request traces for replay: the Mooncake format, and the common ``SimRequest`` shape.

Mooncake trace lines are ``{"timestamp": ms, "input_length": n, "output_length": m,
"hash_ids": [...]}`` with one id per 512-token block (the last one partial); equal ids mean
equal prefixes. Raw text is not published, so each hash id is expanded into 512 deterministic
token ids (a 64-bit mix of the id and the position, mod the vocabulary): equal ids give equal
tokens, different ids different tokens. The simulator's workers and the router then hash those
tokens with ``interlock.kvhash`` at their own block size (64 here, as in Dynamo's replay), like
a real deployment would.

Hashing every request's tokens is the slow part of loading a trace (145 M tokens for the
conversation trace), so ``TraceHasher`` memoises: an id always has the same predecessor, hence
the kvhash of each of its sub-blocks is a function of the id alone.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np

from interlock.kvhash import ROOT_PARENT, hash_block

TRACE_BLOCK_SIZE = 512
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


@dataclass(frozen=True, slots=True)
class MooncakeRecord:
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def load_mooncake(path: str | Path, limit: int | None = None) -> list[MooncakeRecord]:
    out: list[MooncakeRecord] = []
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            d = json.loads(line)
            out.append(MooncakeRecord(float(d["timestamp"]), int(d["input_length"]),
                                      int(d["output_length"]), tuple(d["hash_ids"])))
            if limit is not None and len(out) >= limit:
                break
    return out


def hash_id_tokens(hash_id: int, n: int = TRACE_BLOCK_SIZE, vocab_size: int = VOCAB_SIZE) -> np.ndarray:
    """The first ``n`` deterministic token ids of trace block ``hash_id`` (splitmix64 mix)."""
    with np.errstate(over="ignore"):
        x = np.arange(n, dtype=np.uint64) + np.uint64(hash_id) * np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return (x % np.uint64(vocab_size)).astype(np.uint32)


def record_token_ids(rec: MooncakeRecord, trace_block_size: int = TRACE_BLOCK_SIZE) -> np.ndarray:
    """The full prompt of a trace record (for online replay against real processes)."""
    parts = [hash_id_tokens(h, trace_block_size) for h in rec.hash_ids]
    return np.concatenate(parts)[: rec.input_length] if parts else np.zeros(0, np.uint32)


class TraceHasher:
    """kvhash chains of trace records at ``block_size``, memoised per trace hash id."""

    def __init__(self, block_size: int = 64, trace_block_size: int = TRACE_BLOCK_SIZE) -> None:
        if trace_block_size % block_size:
            raise ValueError("trace block size must be a multiple of the replay block size")
        self.block_size = block_size
        self.trace_block_size = trace_block_size
        self._memo: dict[int, tuple[int, ...]] = {}

    def _sub_hashes(self, hash_id: int, parent: int) -> tuple[int, ...]:
        got = self._memo.get(hash_id)
        if got is None:
            toks = hash_id_tokens(hash_id, self.trace_block_size)
            hs = []
            bs = self.block_size
            for i in range(self.trace_block_size // bs):
                # kvhash accepts any integer array; numpy slices avoid a list per block
                parent = hash_block(parent, cast(Sequence[int], toks[i * bs : (i + 1) * bs]))
                hs.append(parent)
            got = self._memo[hash_id] = tuple(hs)
        return got

    def hashes(self, rec: MooncakeRecord) -> tuple[int, ...]:
        n_full = rec.input_length // self.block_size
        out: list[int] = []
        parent = ROOT_PARENT
        for hid in rec.hash_ids:
            sub = self._sub_hashes(hid, parent)
            out.extend(sub)
            parent = sub[-1]
            if len(out) >= n_full:
                break
        return tuple(out[:n_full])


def mooncake_requests(records: Sequence[MooncakeRecord], *, block_size: int = 64,
                      speedup: float = 1.0, hasher: TraceHasher | None = None,
                      with_tokens: bool = False) -> list[SimRequest]:
    """Trace records as ``SimRequest``s, arrivals divided by ``speedup``."""
    hasher = hasher or TraceHasher(block_size)
    t0 = records[0].timestamp_ms if records else 0.0
    return [
        SimRequest(f"r{i}", (r.timestamp_ms - t0) / 1000.0 / speedup, r.input_length,
                   max(r.output_length, 1), hasher.hashes(r),
                   token_ids=tuple(record_token_ids(r).tolist()) if with_tokens else None)
        for i, r in enumerate(records)
    ]
