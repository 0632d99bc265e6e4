"""A deterministic model runner for tests and simulation: no model, real paged "KV".

Its KV cache is an int32 array with one slot per (block, offset) that stores the token id
computed at that position. The next token is a hash of a few tokens *read back from the KV
cache* (the first, the middle one and the last ``context``) and the position, mod
``vocab_size``. So:

  * the same prompt gives the same output regardless of batching, chunking, prefix hits,
    preemption or where its KV was computed (aggregated and disaggregated runs compare);
  * a wrong block table, a lost block or a broken KV transfer changes the output, so tests of
    those paths are real tests; export/import copy actual bytes.

With ``shared=True`` the KV array lies on a memfd (``engine.shared_cache``), so a decode worker
of the same host copies a prefill's blocks straight out of it, as with the torch runner's
shared cache (layout: one piece of ``block_size`` int32 per block).

Each step's time comes from ``timing.TimingModel``; it is recorded in ``last_step_time_s`` and
slept only on a real-time clock (a simulation advances its virtual clock itself).

Logprobs, of sampled and of prompt tokens alike, are 0 (the mock is certain of each token),
with the token itself as its one alternative when any are asked for.
"""

from __future__ import annotations

import os
import weakref
from array import array
from collections.abc import MutableSequence, Sequence
from typing import cast

import numpy as np

from interlock.engine.clock import Clock
from interlock.engine.runner import RunnerOutput, ScheduledRequest, SchedulerOutput
from interlock.engine.shared_cache import (
    SharedCacheView,
    layout_mismatch,
    part_range,
    region_of,
    shared_mapping,
)
from interlock.engine.timing import TimingModel
from interlock.protocol import TokenLogprobs
from interlock.protocol.transfer import SharedCacheRegion

_DTYPE = "mock-int32"
"""The mock's KV dtype as a shared cache names it (only another mock copies from it)."""

_MASK = (1 << 64) - 1


def context_positions(end: int, context: int) -> list[int]:
    """Positions the mock model reads to predict the token at ``end`` (O(1) of them)."""
    return [0, end // 2, *range(max(0, end - context), end)]


def mock_next_token(context: Sequence[int], position: int, vocab_size: int) -> int:
    """The mock model: a hash of the context tokens and the position of the next token.

    Python's hash of a tuple of ints is deterministic (no per-process seed, unlike str), and
    fast; the final mix spreads it over the vocabulary."""
    h = (hash((position, *context)) * 0x9E3779B97F4A7C15) & _MASK
    return (h >> 17) % vocab_size


class MockRunner:
    def __init__(
        self,
        *,
        num_blocks: int,
        block_size: int = 16,
        vocab_size: int = 49152,
        eos_token_ids: tuple[int, ...] = (2,),
        context: int = 4,
        timing: TimingModel | None = TimingModel(),
        clock: Clock | None = None,
        shared: bool = False,
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self.kv_block_nbytes = block_size * 4
        self.context = context
        self.timing = timing
        self.clock = clock
        # One buffer, two views: array.array (a memoryview of a shared one) for fast scalar
        # access in the per-token paths, numpy for bulk copies (export/import, long chunks).
        self._memfd = -1
        self._flat: MutableSequence[int]
        if shared:
            self._memfd, self._mem = shared_mapping(num_blocks * block_size * 4, "interlock-mock-kv")
            weakref.finalize(self, os.close, self._memfd)
            flat = memoryview(self._mem).cast("i")
            self._flat = cast("MutableSequence[int]", flat)
            self.kv = np.frombuffer(flat, dtype=np.int32).reshape(num_blocks, block_size)
            self.kv[:] = -1
        else:
            self._flat = array("i", [-1]) * (num_blocks * block_size)
            self.kv = np.frombuffer(self._flat, dtype=np.int32).reshape(num_blocks, block_size)
        self.last_step_time_s = 0.0
        self.steps = 0

    def execute(self, batch: SchedulerOutput) -> RunnerOutput:
        out = RunnerOutput()
        prefill_tokens = num_decodes = kv_tokens = 0
        for s in batch.scheduled:
            n = len(s.token_ids)
            self._write(s)
            kv_tokens += s.start_pos + n
            if n == 1 and s.num_output_tokens > 0:
                num_decodes += 1
            else:
                prefill_tokens += n
            if s.prompt_logprob_positions:
                out.prompt_logprobs[s.request_id] = _prompt_logprobs(s)
            if s.do_sample:
                token = self._next_token(s.block_table, s.start_pos + n)
                out.sampled[s.request_id] = token
                if s.sampling.logprobs is not None:
                    top = ((token, 0.0),) * min(s.sampling.logprobs, 1)
                    out.logprobs[s.request_id] = TokenLogprobs(token, 0.0, top)
        self.steps += 1
        self._account_time(prefill_tokens, num_decodes, kv_tokens)
        return out

    def _account_time(self, prefill_tokens: int, num_decodes: int, kv_tokens: int) -> None:
        if self.timing is None:
            self.last_step_time_s = 0.0
            return
        usage = kv_tokens / (self.num_blocks * self.block_size)
        self.last_step_time_s = self.timing.step_s(prefill_tokens, num_decodes, usage)
        if self.clock is not None and self.clock.realtime:
            self.clock.sleep(self.last_step_time_s)

    def _write(self, s: ScheduledRequest) -> None:
        bs, table, start = self.block_size, s.block_table, s.start_pos
        n = len(s.token_ids)
        if n == 1:  # decode: the hot path
            self._flat[table[start // bs] * bs + start % bs] = s.token_ids[0]
            return
        if n <= 8:
            flat = self._flat
            for i, t in enumerate(s.token_ids):
                p = start + i
                flat[table[p // bs] * bs + p % bs] = t
            return
        pos = np.arange(start, start + n)
        slots = np.asarray(table, dtype=np.int64)[pos // bs] * bs + pos % bs
        self.kv.reshape(-1)[slots] = np.asarray(s.token_ids, dtype=np.int32)

    def _next_token(self, table: Sequence[int], end: int) -> int:
        bs, flat = self.block_size, self._flat
        ctx = [flat[table[p // bs] * bs + p % bs] for p in context_positions(end, self.context)]
        return mock_next_token(ctx, end, self.vocab_size)

    def close(self) -> None:
        pass

    def offload(self) -> bool:
        return False

    weights_load_s = 0.0
    """The mock's weights never leave."""
    last_reload_s = 0.0

    def load_weights(self) -> float:
        return 0.0

    def export_blocks(self, block_ids: Sequence[int], out: memoryview) -> None:
        dst = np.frombuffer(out, dtype=np.int32).reshape(len(block_ids), self.block_size)
        dst[:] = self.kv[np.asarray(block_ids, dtype=np.int64)]

    def import_blocks(self, block_ids: Sequence[int], data: memoryview) -> None:
        src = np.frombuffer(data, dtype=np.int32).reshape(len(block_ids), self.block_size)
        self.kv[np.asarray(block_ids, dtype=np.int64)] = src

    def import_each(self, block_ids: Sequence[int], blocks: Sequence[memoryview]) -> None:
        if len(blocks) != len(block_ids):
            raise ValueError(f"{len(blocks)} blocks for {len(block_ids)} block ids")
        for b, data in zip(block_ids, blocks, strict=True):
            self.import_blocks([b], data)

    def shared_region(self) -> SharedCacheRegion | None:
        if self._memfd < 0:
            return None
        return region_of(
            self._memfd, num_blocks=self.num_blocks, piece=self.block_size * 4, pieces=1, dtype=_DTYPE
        )

    def region_mismatch(self, region: SharedCacheRegion) -> str:
        return layout_mismatch(region, self.block_size * 4, 1, _DTYPE)

    def kv_layout(self) -> tuple[int, int, str]:
        return (self.block_size * 4, 1, _DTYPE)

    def copy_from_shared(
        self,
        view: SharedCacheView,
        src_ids: Sequence[int],
        block_ids: Sequence[int],
        part: tuple[int, int] = (0, 1),
    ) -> None:
        """A part is a slice of every block's token slots (``part_range``)."""
        if reason := self.region_mismatch(view.region):
            raise ValueError(reason)
        if len(src_ids) != len(block_ids):
            raise ValueError(f"{len(src_ids)} source block ids for {len(block_ids)} block ids")
        t0, t1 = part_range(part, self.block_size)
        src_n = view.region.num_blocks
        for s, b in zip(src_ids, block_ids, strict=True):  # all checked before anything is copied
            if not 0 <= s < src_n:
                raise IndexError(f"source block id {s} out of range [0, {src_n})")
            if not 0 <= b < self.num_blocks:
                raise IndexError(f"block id {b} out of range [0, {self.num_blocks})")
        src = view.array.view(np.int32).reshape(src_n, self.block_size)
        dst, srcs = np.asarray(block_ids, dtype=np.int64), np.asarray(src_ids, dtype=np.int64)
        self.kv[dst, t0:t1] = src[srcs, t0:t1]


def _prompt_logprobs(s: ScheduledRequest) -> list[TokenLogprobs]:
    """The mock is sure of every token: logprob 0 for each prompt token (as for sampled ones),
    itself the one alternative when any is asked for."""
    n = min(s.sampling.prompt_logprobs or 0, 1)
    positions = s.prompt_logprob_positions
    targets = s.prompt_token_ids[positions.start + 1 : positions.stop + 1]
    return [TokenLogprobs(t, 0.0, ((t, 0.0),) * n) for t in targets]


def reference_output(
    prompt: Sequence[int], max_tokens: int, *, vocab_size: int = 49152, context: int = 4
) -> list[int]:
    """What the mock generates for ``prompt`` (no stop tokens): the oracle for tests."""
    seq = list(prompt)
    out: list[int] = []
    for _ in range(max_tokens):
        t = mock_next_token([seq[p] for p in context_positions(len(seq), context)], len(seq), vocab_size)
        seq.append(t)
        out.append(t)
    return out
