"""A step cut into micro-batches for a pipeline (pure).

With ``P`` stages, a step's chunks go through as up to ``P`` micro-batches of about equal
tokens, so that stage 1 works on the first while stage 0 computes the second. Chunks are not
split (a chunk's attention needs its whole query in one pass). Each micro-batch carries the
rows of its hidden states that the sampler needs; ``gather`` says where each of the step's
requested rows lies in the micro-batches' answers, concatenated.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from interlock.engine.model.batch import row_order
from interlock.engine.parallel.messages import Micro


def cut(lengths: Sequence[int], parts: int) -> list[range]:
    """Chunk indices ``0..len(lengths)-1`` in at most ``parts`` contiguous runs of about equal
    tokens (each run at least one chunk)."""
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


def plan(
    chunks: Sequence[tuple[list[int], int, list[int]]],
    last_rows: Sequence[int],
    rows: Sequence[int],
    parts: int,
) -> tuple[tuple[Micro, ...], list[int]]:
    """The step's micro-batches, and for each requested row (``rows``: rows of the whole
    step's batch, whose chunk i ends at ``last_rows[i]``) its place in the micro-batches'
    answers, one after another."""
    lengths = [len(c[0]) for c in chunks]
    runs = cut(lengths, parts)
    firsts = [last_rows[i] - lengths[i] + 1 for i in range(len(chunks))]
    by_first = sorted(range(len(chunks)), key=firsts.__getitem__)
    sorted_firsts = [firsts[i] for i in by_first]
    micro_of = [0] * len(chunks)
    local_first = [0] * len(chunks)
    for m, run in enumerate(runs):
        _, local_last = row_order([lengths[i] for i in run])
        for j, i in enumerate(run):
            micro_of[i] = m
            local_first[i] = local_last[j] - lengths[i] + 1
    wanted: list[list[int]] = [[] for _ in runs]
    place: list[tuple[int, int]] = []
    for row in rows:
        i = by_first[bisect.bisect_right(sorted_firsts, row) - 1]
        m = micro_of[i]
        place.append((m, len(wanted[m])))
        wanted[m].append(local_first[i] + row - firsts[i])
    offsets = [0]
    for w in wanted:
        offsets.append(offsets[-1] + len(w))
    micro = tuple(Micro(tuple(chunks[i] for i in run), tuple(w)) for run, w in zip(runs, wanted, strict=True))
    return micro, [offsets[m] + k for m, k in place]
