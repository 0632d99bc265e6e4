"""The token budget: a prompt over its token limit is refused before it is encoded in full.

Encoding a prompt just under ``max_prompt_chars`` (a million characters: ~2 s of CPU and ~30 MB
that the allocator keeps) only to refuse it for the context length made a few such requests an
easy way to exhaust the frontend. So a long text is screened first:

* a cheap upper bound: a token stands for at least one UTF-8 byte (byte-level BPE; a
  SentencePiece piece for at least one character, a byte-fallback token for one byte), so a text
  whose bytes, plus the special tokens the tokenizer adds, fit the budget cannot be over it;
* otherwise the text is encoded chunk by chunk (``CHUNK_CHARS``) with a running count that stops
  as soon as it passes the budget: the work is bounded by the budget, not by the text.

Where the tokenizer's ids do not change at a cut between words (``chunked.py``: byte-level BPE
with a GPT-2-style pre-tokenizer), the screen and the encoding are one pass: the chunks are
encoded (or found in the chunk cache), counted as they come, and joined. Elsewhere chunks are cut
at a space between two words, where a pre-tokenizer splits anyway, so their tokens are the whole
text's; only a text with no such space near a cut is cut inside a word, which moves the count by
a token or two. Each cut is allowed ``SOFT_SLACK`` / ``HARD_SLACK`` tokens before the count is
taken as a proof, so the screen refuses only what the full encoding would. A text that passes is
then encoded whole, once: the ids a worker sees (its prefix-cache keys) never depend on where the
screen cut.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from interlock.errors import LimitExceeded, PromptTooLong, RequestError
from interlock.frontend.chunked import CHUNK_CHARS, PARALLEL_CHARS, ChunkedEncoder, Plan, chunks
from interlock.frontend.tokenizer import ModelTokenizer

SOFT_SLACK = 1  # a dummy-prefix tokenizer may add a "▁" token at the start of a chunk
HARD_SLACK = 4  # a cut inside a word: measured at most 2 on SmolLM2's BPE, twice that allowed
CHARS_PER_TOKEN_BOUND = 8
"""How many characters of not yet encoded chunks go to the tokenizer per token the budget has
left: at most this many times the budget is encoded past it before the count proves it over
(byte-level BPE averages about 4 characters a token on text)."""


@dataclass(frozen=True)
class TokenBudget:
    """The most prompt tokens a request may have, and which limit sets it."""

    max_prompt_tokens: int | None
    context_length: int

    @property
    def limit(self) -> int:
        room = self.context_length - 1  # at least one token must fit after the prompt
        return room if self.max_prompt_tokens is None else min(room, self.max_prompt_tokens)

    def refusal(self, at_least: int, param: str) -> RequestError:
        if self.max_prompt_tokens is not None and at_least > self.max_prompt_tokens:
            return LimitExceeded(
                f"the prompt is at least {at_least} tokens; this server accepts at most "
                f"{self.max_prompt_tokens} (max_prompt_tokens)",
                param=param,
            )
        return PromptTooLong(
            f"This model's maximum context length is {self.context_length} tokens. However, your "
            f"prompt is at least {at_least} tokens, which leaves no room for a completion.",
            param=param,
        )


def upper_bound(text: str, specials: int) -> int:
    """Tokens ``text`` can encode to at most."""
    return (len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))) + specials


def screen(count: Callable[[str], int], text: str, limit: int, specials: int) -> int | None:
    """None if ``text`` may fit ``limit`` tokens; else a proven lower bound of its tokens (above
    ``limit``). ``count`` encodes one chunk without special tokens."""
    counted = specials
    slack = 0
    for piece, soft in chunks(text):
        counted += count(piece)
        if counted - slack > limit:
            return counted - slack
        slack += SOFT_SLACK if soft else HARD_SLACK
    return None


async def encode_within(
    tok: ModelTokenizer, text: str, *, add_special_tokens: bool, budget: TokenBudget | None, param: str
) -> Sequence[int]:
    """``text``'s token ids, or the budget's refusal, found without encoding far past it."""
    limit = budget.limit if budget is not None else None
    prefix = tok.special_prefix if add_special_tokens else []
    enc = tok.chunked
    if len(text) > CHUNK_CHARS and enc is not None and prefix is not None:
        key = enc.prompt_key(text, add_special_tokens)
        ids: tuple[int, ...] | int | None = enc.prompts.get(key)
        if ids is None:
            plan = await asyncio.to_thread(enc.plan, text)
            if plan is not None:
                ids = await encode_pieces(enc, plan, prefix, limit)
                if not isinstance(ids, int):
                    enc.prompts.put(key, ids)
        if isinstance(ids, int) or (ids is not None and limit is not None and len(ids) > limit):
            assert budget is not None
            raise budget.refusal(ids if isinstance(ids, int) else len(ids), param)
        if ids is not None:
            return ids
    if enc is not None and prefix is not None and len(text) <= CHUNK_CHARS:
        pieces = enc.cut_plan(text)  # a chat's system prompt and earlier turns come from the cache
        if pieces is not None:
            new = pieces.missing_chars >= PARALLEL_CHARS  # much to encode: off the event loop
            cut = await asyncio.to_thread(enc.fill, pieces) if new else enc.fill(pieces)
            return (*prefix, *cut) if prefix else cut
    specials = tok.num_special_tokens if add_special_tokens else 0
    if budget is not None and len(text) > CHUNK_CHARS and upper_bound(text, specials) > budget.limit:
        # encode_batch releases the GIL: the screen runs beside the event loop.
        at_least = await asyncio.to_thread(screen, tok.count, text, budget.limit, specials)
        if at_least is not None:
            raise budget.refusal(at_least, param)
    return await tok.encode_async(text, add_special_tokens=add_special_tokens)


async def encode_pieces(
    enc: ChunkedEncoder, plan: Plan, prefix: list[int], limit: int | None
) -> tuple[int, ...] | int:
    """The ids of the planned pieces joined after ``prefix`` (seams exact: ``chunked.py``), or,
    once more than ``limit``, the count so far (a proven lower bound). Cached pieces cost
    nothing more; the rest are encoded off the event loop, in groups sized by the budget left."""
    pieces, keys, found = plan
    known = len(prefix) + sum(len(ids) for ids in found if ids is not None)
    missing = [i for i, ids in enumerate(found) if ids is None]
    encoded: dict[int, tuple[int, ...]] = {}
    while missing and (limit is None or known <= limit):
        room = None if limit is None else max(CHUNK_CHARS, CHARS_PER_TOKEN_BOUND * (limit - known))
        group, chars = [], 0
        while missing and (room is None or chars < room):
            group.append(missing.pop(0))
            chars += len(pieces[group[-1]])
        batch = await asyncio.to_thread(enc.encode, [pieces[i] for i in group])
        enc.store([keys[i] for i in group], batch)
        for i, piece_ids in zip(group, batch, strict=True):
            encoded[i] = piece_ids
            known += len(piece_ids)
    if limit is not None and known > limit:
        return known
    out = list(prefix)
    for i, cached in enumerate(found):
        out.extend(cached if cached is not None else encoded[i])
    return tuple(out)
