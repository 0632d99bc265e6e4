"""A step cut into micro-batches for a pipeline (pure).

With ``P`` stages, a step's chunks go through as up to ``P`` micro-batches of about equal
tokens, so that stage 1 works on the first while stage 0 computes the second. A step of fewer
chunks than stages (one long prompt) has its prefill chunks cut into pieces first, as chunked
prefill cuts a prompt across steps: piece ``k + 1`` starts where piece ``k`` ends and reads its
KV, which every stage has written before the next piece reaches it (a stage takes its
micro-batches in order; two pieces in one micro-batch are fine too, since each layer writes
the batch's KV before any of it attends). Pieces are at least ``MIN_PIECE`` tokens.

Each micro-batch carries the rows of its hidden states the sampler needs; ``plan`` also says
where each of the step's requested rows lies in the micro-batches' answers, concatenated.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from interlock.engine.model.batch import row_order
from interlock.engine.parallel.messages import Micro

MIN_PIECE = 32
"""Tokens of a prompt piece at least: a smaller one costs its stage more in overhead than the
overlap gains."""

Chunk = tuple[list[int], int, list[int]]


@dataclass(frozen=True, slots=True)
class _Piece:
    chunk: int
    start: int
    """Offset of its first token in its chunk."""
    length: int


def cut(lengths: Sequence[int], parts: int) -> list[range]:
    """Indices ``0..len(lengths)-1`` in at most ``parts`` contiguous runs of about equal
    tokens (each run at least one index)."""
    parts = max(1, min(parts, len(lengths)))
    total = sum(lengths)
    runs: list[range] = []
    start = acc = 0
    for i, n in enumerate(lengths):
        acc += n
        left_chunks = len(lengths) - i - 1
        left_runs = parts - len(runs) - 1
        if left_runs and (acc * parts >= total * (len(runs) + 1) or left_chunks == left_runs):
            runs.append(range(start, i + 1))
            start = i + 1
    runs.append(range(start, len(lengths)))
    return [r for r in runs if len(r)]


def pieces(lengths: Sequence[int], parts: int) -> list[_Piece]:
    """Each chunk whole, or (with fewer chunks than ``parts``) the longest ones cut into
    pieces of at least ``MIN_PIECE`` tokens until there are ``parts`` in all."""
    count = [1] * len(lengths)
    while sum(count) < parts:
        i = max(range(len(lengths)), key=lambda k: lengths[k] / count[k], default=None)
        if i is None or lengths[i] // (count[i] + 1) < MIN_PIECE:
            break
        count[i] += 1
    out = []
    for i, (n, k) in enumerate(zip(lengths, count, strict=True)):
        bounds = [n * j // k for j in range(k + 1)]
        out += [_Piece(i, a, b - a) for a, b in zip(bounds, bounds[1:], strict=False)]
    return out


def plan(
    chunks: Sequence[Chunk],
    last_rows: Sequence[int],
    rows: Sequence[int],
    parts: int,
) -> tuple[tuple[Micro, ...], list[int]]:
    """The step's micro-batches, and for each requested row (``rows``: rows of the whole
    step's batch, whose chunk i ends at ``last_rows[i]``) its place in the micro-batches'
    answers, one after another."""
    lengths = [len(c[0]) for c in chunks]
    cuts = pieces(lengths, parts)
    runs = cut([p.length for p in cuts], parts)
    firsts = [last_rows[i] - lengths[i] + 1 for i in range(len(chunks))]
    by_first = sorted(range(len(chunks)), key=firsts.__getitem__)
    sorted_firsts = [firsts[i] for i in by_first]
    piece_starts: list[list[int]] = [[] for _ in chunks]  # offsets of each chunk's pieces
    where: dict[tuple[int, int], tuple[int, int]] = {}  # (chunk, piece) -> (micro, first row)
    for m, run in enumerate(runs):
        _, local_last = row_order([cuts[k].length for k in run])
        for j, k in enumerate(run):
            p = cuts[k]
            piece_starts[p.chunk].append(p.start)
            where[p.chunk, len(piece_starts[p.chunk]) - 1] = (m, local_last[j] - p.length + 1)
    wanted: list[list[int]] = [[] for _ in runs]
    place: list[tuple[int, int]] = []
    for row in rows:
        i = by_first[bisect.bisect_right(sorted_firsts, row) - 1]
        offset = row - firsts[i]
        k = bisect.bisect_right(piece_starts[i], offset) - 1
        m, first = where[i, k]
        place.append((m, len(wanted[m])))
        wanted[m].append(first + offset - piece_starts[i][k])
    offsets = [0]
    for w in wanted:
        offsets.append(offsets[-1] + len(w))
    micro = tuple(
        Micro(tuple(_piece_chunk(chunks[cuts[k].chunk], cuts[k]) for k in run), tuple(w))
        for run, w in zip(runs, wanted, strict=True)
    )
    return micro, [offsets[m] + k for m, k in place]


def _piece_chunk(chunk: Chunk, piece: _Piece) -> Chunk:
    ids, start, table = chunk
    if piece.length == len(ids):
        return chunk
    return ids[piece.start : piece.start + piece.length], start + piece.start, table
