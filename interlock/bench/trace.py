"""Mooncake-format traces: one JSON object per line with ``timestamp`` (ms since the trace's
start), ``input_length``, ``output_length`` and ``hash_ids`` (one id per block of prompt).

Each hash id becomes the same ``block_size``-token block every time (:func:`hash_block`), so
requests that share leading hash ids share their prompt prefix on the wire, as in the trace.
The prompt is the concatenation of its blocks cut to ``input_length`` (the last block is
partial); a prompt longer than its blocks is padded with tokens unique to the request.

Replay time: request ``k`` is sent at ``(timestamp_k - timestamp_0) / 1000 * time_scale``
seconds after the start; ``time_scale`` 0.5 replays twice as fast.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from interlock.bench.prompts import Prompt, make_prompt
from interlock.bench.vocab import Vocab
from interlock.errors import ConfigError

BLOCK_SIZE = 512


@dataclass(frozen=True)
class TraceEntry:
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def load_trace(path: str | Path, limit: int | None = None) -> list[TraceEntry]:
    entries: list[TraceEntry] = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if limit is not None and len(entries) >= limit:
                break
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                entries.append(
                    TraceEntry(
                        timestamp_ms=float(row["timestamp"]),
                        input_length=int(row["input_length"]),
                        output_length=int(row["output_length"]),
                        hash_ids=tuple(int(h) for h in row.get("hash_ids", ())),
                    )
                )
            except (ValueError, KeyError, TypeError) as exc:
                raise ConfigError(f"{path}:{lineno}: not a Mooncake trace line ({exc})") from exc
    if not entries:
        raise ConfigError(f"trace {path} has no requests")
    return entries


def send_offsets(entries: list[TraceEntry], time_scale: float) -> list[float]:
    """Seconds after the start at which each entry is sent (pure)."""
    if time_scale <= 0:
        raise ConfigError("time scale must be positive")
    t0 = entries[0].timestamp_ms
    return [(e.timestamp_ms - t0) / 1000.0 * time_scale for e in entries]


def hash_block(vocab: Vocab, hash_id: int, block_size: int = BLOCK_SIZE) -> list[int]:
    """The deterministic token block of one hash id."""
    return vocab.block(f"hash:{block_size}:{hash_id}", block_size)


class TracePrompts:
    """Builds trace prompts, keeping recently used blocks (the trace reuses prefixes a lot)."""

    def __init__(self, vocab: Vocab, block_size: int = BLOCK_SIZE, cache_blocks: int = 4096) -> None:
        self._vocab = vocab
        self._block_size = block_size
        self._cache: OrderedDict[int, list[int]] = OrderedDict()
        self._cache_blocks = cache_blocks

    def _block(self, hash_id: int) -> list[int]:
        block = self._cache.get(hash_id)
        if block is None:
            block = hash_block(self._vocab, hash_id, self._block_size)
            self._cache[hash_id] = block
            if len(self._cache) > self._cache_blocks:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(hash_id)
        return block

    def prompt(self, entry: TraceEntry, index: int) -> Prompt:
        ids: list[int] = []
        for hash_id in entry.hash_ids:
            if len(ids) >= entry.input_length:
                break
            ids += self._block(hash_id)
        del ids[entry.input_length :]
        if len(ids) < entry.input_length:
            ids += self._vocab.block(f"trace-pad:{index}", entry.input_length - len(ids))
        return make_prompt(ids, self._vocab, max(1, entry.output_length))
