"""Incremental detokenization that never emits broken UTF-8.

A token is not a character: byte-level tokenizers split one character over several tokens, and
sentencepiece tokenizers decide spaces from context. Decoding each token alone would emit
U+FFFD halves and lost spaces. The vLLM way: keep two offsets into the token list,
``prefix_offset`` (start of a short decoded context) and ``read_offset`` (end of what has been
emitted). For new tokens, decode ``tokens[prefix_offset:]`` and ``tokens[prefix_offset:read_offset]``;
the difference is the new text. If it ends in U+FFFD, the last character is still incomplete:
emit nothing and wait for more tokens. Each step decodes two short slices, so the cost per token
does not grow with the length of the output.

The context starts with the last few prompt tokens, so the first output token is decoded the
way it is in context (leading spaces).

A byte-level tokenizer (GPT-2, SmolLM2, Llama 3, Qwen2) needs no context: its text is the
concatenation of its tokens' bytes, so each push looks its tokens' bytes up in a table and feeds
them to an incremental UTF-8 decoder, which holds an incomplete character back until its last
byte comes (and, like the tokenizer, replaces bytes no character can have with U+FFFD). Two
``decode`` calls a push: frontend CPU a streamed request 0.505 → 0.47 ms without them.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence

from interlock.frontend.tokenizer import ModelTokenizer

PROMPT_CONTEXT_TOKENS = 5
REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    def __init__(
        self, tokenizer: ModelTokenizer, prompt_ids: Sequence[int] = (), *, skip_special_tokens: bool = True
    ) -> None:
        self._decode = tokenizer.tokenizer.decode
        self._skip = skip_special_tokens
        self._table = tokenizer.byte_table(skip_special_tokens)
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        if self._table is not None:
            return
        self._tokens: list[int] = list(prompt_ids[-PROMPT_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._tokens)
        self._prefix_text = self._decode(self._tokens, skip_special_tokens=self._skip)

    def push(self, token_ids: Sequence[int]) -> str:
        """Add new tokens; return the text that is now complete (maybe "")."""
        if not token_ids:
            return ""
        table = self._table
        if table is not None:
            n = len(table)
            return self._utf8.decode(b"".join([table[i] if 0 <= i < n else b"" for i in token_ids]))
        self._tokens.extend(token_ids)
        full = self._decode(self._tokens[self._prefix_offset :], skip_special_tokens=self._skip)
        if full.endswith(REPLACEMENT_CHAR) or len(full) <= len(self._prefix_text):
            return ""  # an incomplete character (or nothing visible yet): wait for more
        new_text = full[len(self._prefix_text) :]
        self._advance()
        return new_text

    def flush(self) -> str:
        """At the end: whatever is still held back (an incomplete tail is emitted as U+FFFD)."""
        if self._table is not None:
            return self._utf8.decode(b"", final=True)
        full = self._decode(self._tokens[self._prefix_offset :], skip_special_tokens=self._skip)
        new_text = full[len(self._prefix_text) :]
        self._advance()
        return new_text

    def _advance(self) -> None:
        # The new context starts where the emitted text ended, so the next step decodes only
        # the tokens that are not yet emitted plus this boundary.
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._tokens)
        self._prefix_text = self._decode(
            self._tokens[self._prefix_offset : self._read_offset], skip_special_tokens=self._skip
        )
