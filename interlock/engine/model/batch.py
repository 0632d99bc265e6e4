"""Turn a step's chunks (tokens, start position, block table) into the model's input tensors.

Chunks of exactly one token go first and share the batched decode attention, whatever their
origin (a decode step, the last prompt token after a prefix hit); longer chunks follow as
prefill spans. ``last_rows[i]`` is the row of chunk i's last token, for picking its logits.
Everything is built from Python lists and turned into tensors once per step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from interlock.engine.model.attention import AttentionMetadata, PrefillSpan


@dataclass(frozen=True, slots=True)
class SequenceChunk:
    token_ids: Sequence[int]
    start_pos: int
    block_table: Sequence[int]


@dataclass(frozen=True)
class ModelInput:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    last_rows: list[int]
    """For chunk i (in the caller's order): row of its last token in the flattened batch."""


def build_input(
    chunks: Sequence[SequenceChunk], block_size: int, device: torch.device, *, fused: bool
) -> ModelInput:
    """``fused``: metadata for the fused attention kernel (``LlamaModel.fused_attention``),
    else for the plain PyTorch attention; each step builds only the kind its model reads."""
    order, last_rows = row_order([len(c.token_ids) for c in chunks])
    num_decode = sum(1 for c in chunks if len(c.token_ids) == 1)
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    for i in order:
        chunk = chunks[i]
        table = chunk.block_table
        for pos in range(chunk.start_pos, chunk.start_pos + len(chunk.token_ids)):
            positions.append(pos)
            slots.append(table[pos // block_size] * block_size + pos % block_size)
        ids.extend(chunk.token_ids)
    slot_mapping = torch.tensor(slots, dtype=torch.long, device=device)
    if fused:
        seq_info, block_tables = _sequence_tables([chunks[i] for i in order], block_size, device)
        meta = AttentionMetadata(slot_mapping, num_decode, None, None, (), seq_info, block_tables)
    else:
        decode_table, decode_bias = _decode_tables(
            [chunks[i] for i in order[:num_decode]], block_size, device
        )
        prefills = _prefill_spans([chunks[i] for i in order[num_decode:]], num_decode, block_size, device)
        meta = AttentionMetadata(slot_mapping, num_decode, decode_table, decode_bias, prefills, None, None)
    return ModelInput(
        input_ids=torch.tensor(ids, dtype=torch.long, device=device),
        positions=torch.tensor(positions, dtype=torch.long, device=device),
        meta=meta,
        last_rows=last_rows,
    )


def row_order(lengths: Sequence[int]) -> tuple[list[int], list[int]]:
    """For chunks of ``lengths`` tokens: the order their rows take in the batch (one-token
    chunks first, then the rest, each group in the given order) and each chunk's last row."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i] != 1)
    last_rows = [0] * len(lengths)
    row = 0
    for i in order:
        row += lengths[i]
        last_rows[i] = row - 1
    return order, last_rows


def _sequence_tables(
    ordered: Sequence[SequenceChunk], block_size: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    info: list[list[int]] = []
    tables: list[list[int]] = []
    row = 0
    for chunk in ordered:
        n = len(chunk.token_ids)
        info.append([row, n, chunk.start_pos])
        tables.append(list(chunk.block_table[: (chunk.start_pos + n + block_size - 1) // block_size]))
        row += n
    width = max((len(t) for t in tables), default=0)
    padded = [t + [0] * (width - len(t)) for t in tables]
    return (
        torch.tensor(info, dtype=torch.long, device=device).view(len(info), 3),
        torch.tensor(padded, dtype=torch.long, device=device).view(len(padded), width),
    )


def _decode_tables(
    decode: Sequence[SequenceChunk], block_size: int, device: torch.device
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    if not decode:
        return None, None
    lengths = [c.start_pos + 1 for c in decode]
    max_blocks = (max(lengths) + block_size - 1) // block_size
    flat: list[int] = []
    for chunk, length in zip(decode, lengths, strict=True):
        used = list(chunk.block_table[: (length + block_size - 1) // block_size])
        # Padding points at the request's own first block: a valid index, masked out below.
        flat.extend(used + [used[0]] * (max_blocks - len(used)))
    context = torch.arange(max_blocks * block_size, device=device)
    lens = torch.tensor(lengths, device=device).unsqueeze(1)
    bias = torch.zeros(len(decode), 1, max_blocks * block_size, device=device)
    bias.masked_fill_((context.unsqueeze(0) >= lens).unsqueeze(1), float("-inf"))
    return torch.tensor(flat, dtype=torch.long, device=device), bias


def _prefill_spans(
    prefill: Sequence[SequenceChunk], first_row: int, block_size: int, device: torch.device
) -> tuple[PrefillSpan, ...]:
    spans = []
    row = first_row
    for chunk in prefill:
        spans.append(_prefill_span(chunk, row, block_size, device))
        row += len(chunk.token_ids)
    return tuple(spans)


def _prefill_span(chunk: SequenceChunk, row: int, block_size: int, device: torch.device) -> PrefillSpan:
    n = len(chunk.token_ids)
    table = mask = None
    if chunk.start_pos:
        context = chunk.start_pos + n
        blocks = list(chunk.block_table[: (context + block_size - 1) // block_size])
        table = torch.tensor(blocks, dtype=torch.long, device=device)
        query_pos = torch.arange(chunk.start_pos, context, device=device).unsqueeze(1)
        mask = torch.arange(context, device=device).unsqueeze(0) <= query_pos
    return PrefillSpan(row, row + n, chunk.start_pos, table, mask)


def split_attention(
    meta: AttentionMetadata, block_size: int, *, plain_decode: bool, plain_prefill: Sequence[bool]
) -> AttentionMetadata:
    """Fused metadata with some parts moved to the plain PyTorch attention: all decode rows
    (``plain_decode``) and the prefill chunks flagged in ``plain_prefill`` (in row order) get
    the plain fields (decode tables, prefill spans); the rest stay in ``seq_info`` /
    ``block_tables`` for the fused kernel (possibly none: then zero sequences)."""
    assert meta.seq_info is not None and meta.block_tables is not None, "only fused metadata is split"
    info = meta.seq_info.tolist()
    device = meta.seq_info.device
    num_seqs = meta.num_decode  # the decode rows' sequences come first, one row each
    plain = [plain_decode] * num_seqs + list(plain_prefill)
    assert len(plain) == len(info), "one flag per prefill chunk"
    if not any(plain):
        return meta
    tables = meta.block_tables.tolist()
    chunks = [
        SequenceChunk(range(n), start, table) for (_first, n, start), table in zip(info, tables, strict=True)
    ]
    decode_table = decode_bias = None
    if plain_decode and num_seqs:
        decode_table, decode_bias = _decode_tables(chunks[:num_seqs], block_size, device)
    spans = tuple(
        _prefill_span(chunks[s], info[s][0], block_size, device)
        for s in range(num_seqs, len(info))
        if plain[s]
    )
    keep = [s for s in range(len(info)) if not plain[s]]
    index = torch.tensor(keep, dtype=torch.long, device=device)
    return AttentionMetadata(
        meta.slot_mapping,
        meta.num_decode,
        decode_table,
        decode_bias,
        spans,
        meta.seq_info.index_select(0, index),
        meta.block_tables.index_select(0, index),
    )
