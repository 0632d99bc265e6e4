"""Trace prompts: Mooncake records (``interlock.mooncake``: loading, speed-up, block expansion)
as prompts of this vocabulary.

The shared expansion gives token indices; here they pick from the vocabulary's pool of
text-safe tokens, so requests that share leading hash ids share their prompt prefix on the
wire, as in the trace (and as text, since pool tokens re-encode to themselves).
"""

from __future__ import annotations

from interlock.bench.prompts import Prompt, make_prompt
from interlock.bench.vocab import Vocab
from interlock.mooncake import TRACE_BLOCK_SIZE, MooncakeRecord, prompt_indices


class TracePrompts:
    def __init__(self, vocab: Vocab, block_size: int = TRACE_BLOCK_SIZE) -> None:
        self._vocab = vocab
        self._block_size = block_size
        self._pool = list(vocab.pool)

    def prompt(self, record: MooncakeRecord, index: int) -> Prompt:
        pool = self._pool
        ids = [pool[i] for i in prompt_indices(record, index, len(pool), self._block_size).tolist()]
        return make_prompt(ids, self._vocab, max(1, record.output_length))
