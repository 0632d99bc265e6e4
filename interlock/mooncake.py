"""Mooncake-format request traces: the one loader, speed-up and block expansion that the load
generator (``interlock bench --trace``) and the simulator (``interlock replay``) share.

A trace line is ``{"timestamp": ms, "input_length": n, "output_length": m, "hash_ids": [...]}``
with one id per ``TRACE_BLOCK_SIZE``-token block of the prompt (the last one partial); equal ids
mean equal prefixes. A bad line or an empty trace is a ``ConfigError`` naming the file (and line).

Time: request ``k`` arrives ``(timestamp_k - timestamp_0) / 1000 / speedup`` seconds after the
first; an arrival speed-up of ×k divides every inter-arrival time by k.

Block expansion: raw text is not published, so each hash id becomes ``TRACE_BLOCK_SIZE``
deterministic token *indices* in ``[0, pool_size)`` (a splitmix64 mix of the id and the
position): equal ids give equal blocks in every process and run, different ids different ones.
A prompt is its blocks concatenated and cut to ``input_length``; a prompt longer than its blocks
is padded with indices unique to the request. The caller maps indices to token ids: the
simulator uses them as ids (its pool is the vocabulary), the load generator picks them from its
vocabulary's pool of text-safe tokens (``interlock.bench.vocab``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from interlock.errors import ConfigError

TRACE_BLOCK_SIZE = 512
GOLDEN = 0x9E3779B97F4A7C15
"""Token j of trace hash id h is splitmix64's finalizer of ``h * GOLDEN + j`` (``blocks_indices``)."""
_GOLDEN = np.uint64(GOLDEN)
_PAD_SALT = np.uint64(0xD1B54A32D192ED03)
"""Keeps a request's padding apart from every hash id's block."""


@dataclass(frozen=True, slots=True)
class MooncakeRecord:
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def load_mooncake(path: str | Path, limit: int | None = None) -> list[MooncakeRecord]:
    """The first ``limit`` records (all when None) of a Mooncake JSONL trace."""
    out: list[MooncakeRecord] = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if limit is not None and len(out) >= limit:
                break
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                out.append(
                    MooncakeRecord(
                        float(row["timestamp"]),
                        int(row["input_length"]),
                        int(row["output_length"]),
                        tuple(int(h) for h in row.get("hash_ids", ())),
                    )
                )
            except (ValueError, KeyError, TypeError) as exc:
                raise ConfigError(f"{path}:{lineno}: not a Mooncake trace line ({exc})") from exc
    if not out:
        raise ConfigError(f"trace {path} has no requests")
    return out


def write_mooncake(records: Sequence[MooncakeRecord], path: str | Path) -> None:
    """Write ``records`` as a Mooncake JSONL trace (what ``load_mooncake`` reads back)."""
    with open(path, "w") as f:
        for r in records:
            f.write(
                json.dumps(
                    {
                        "timestamp": r.timestamp_ms,
                        "input_length": r.input_length,
                        "output_length": r.output_length,
                        "hash_ids": list(r.hash_ids),
                    }
                )
            )
            f.write("\n")


def arrival_offsets(records: Sequence[MooncakeRecord], speedup: float = 1.0) -> list[float]:
    """Seconds after the first arrival at which each record arrives, at ×``speedup``."""
    if speedup <= 0:
        raise ConfigError(f"arrival speed-up must be positive, got {speedup}")
    t0 = records[0].timestamp_ms if records else 0.0
    return [(r.timestamp_ms - t0) / 1000.0 / speedup for r in records]


def _mix(x: np.ndarray, pool_size: int) -> np.ndarray:
    """splitmix64's finalizer of each of ``x`` (uint64, overwritten: it is the caller's scratch)
    into ``[0, pool_size)``, in place (a trace's 94 M tokens: no temporaries of 750 MB)."""
    t = np.empty_like(x)
    with np.errstate(over="ignore"):
        for shift, mul in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
            np.right_shift(x, np.uint64(shift), out=t)
            np.bitwise_xor(x, t, out=x)
            np.multiply(x, np.uint64(mul), out=x)
        np.right_shift(x, np.uint64(31), out=t)
        np.bitwise_xor(x, t, out=x)
    np.remainder(x, np.uint64(pool_size), out=x)
    return x.astype(np.uint32)


def block_indices(hash_id: int, pool_size: int, n: int = TRACE_BLOCK_SIZE) -> np.ndarray:
    """The first ``n`` token indices of trace block ``hash_id``."""
    return blocks_indices([hash_id], pool_size, n)


def blocks_indices(hash_ids: Sequence[int], pool_size: int, n: int = TRACE_BLOCK_SIZE) -> np.ndarray:
    """``block_indices`` of each of ``hash_ids``, one after another, in one vectorised pass."""
    with np.errstate(over="ignore"):
        ids = np.asarray(hash_ids, dtype=np.uint64) * _GOLDEN
        x = np.empty((len(ids), n), dtype=np.uint64)
        np.add(np.arange(n, dtype=np.uint64)[None, :], ids[:, None], out=x)
    return _mix(x.reshape(-1), pool_size)


def _padding_indices(index: int, pool_size: int, start: int, n: int) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = (np.arange(start, start + n, dtype=np.uint64) + np.uint64(index) * _GOLDEN) ^ _PAD_SALT
    return _mix(x, pool_size)


def prompt_indices(
    rec: MooncakeRecord, index: int, pool_size: int, trace_block_size: int = TRACE_BLOCK_SIZE
) -> np.ndarray:
    """The whole prompt of record number ``index`` as token indices in ``[0, pool_size)``."""
    parts = [blocks_indices(rec.hash_ids, pool_size, trace_block_size)] if rec.hash_ids else []
    got = sum(len(p) for p in parts)
    if got < rec.input_length:
        parts.append(_padding_indices(index, pool_size, got, rec.input_length - got))
    return np.concatenate(parts)[: rec.input_length] if parts else np.zeros(0, np.uint32)


__all__ = [
    "TRACE_BLOCK_SIZE",
    "MooncakeRecord",
    "arrival_offsets",
    "block_indices",
    "blocks_indices",
    "load_mooncake",
    "prompt_indices",
    "write_mooncake",
]
