"""The token budget: a prompt over its token limit is refused before it is encoded in full.

Encoding a prompt just under ``max_prompt_chars`` (a million characters: ~2 s of CPU and ~30 MB
that the allocator keeps) only to refuse it for the context length made a few such requests an
easy way to exhaust the frontend. So a long text is screened first:

* a cheap upper bound: a token stands for at least one UTF-8 byte (byte-level BPE; a
  SentencePiece piece for at least one character, a byte-fallback token for one byte), so a text
  whose bytes, plus the special tokens the tokenizer adds, fit the budget cannot be over it;
* otherwise the text is encoded chunk by chunk (``CHUNK_CHARS``) with a running count that stops
  as soon as it passes the budget: the work is bounded by the budget, not by the text.

Chunks are cut at a space between two words, where a pre-tokenizer splits anyway, so their
tokens are the whole text's; only a text with no such space near a cut is cut inside a word,
which moves the count by a token or two. Each cut is allowed ``SOFT_SLACK`` / ``HARD_SLACK``
tokens before the count is taken as a proof, so the screen refuses only what the full encoding
would. A text that passes is then encoded whole, once: the ids a worker sees (its prefix-cache
keys) never depend on where the screen cut.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from interlock.errors import LimitExceeded, PromptTooLong, RequestError
from interlock.frontend.tokenizer import ModelTokenizer

CHUNK_CHARS = 16384
"""Characters encoded per step of the screen (a few thousand tokens)."""
CUT_WINDOW = 1024
"""How far back from a chunk's end a space between words is looked for."""
SOFT_SLACK = 1  # a dummy-prefix tokenizer may add a "▁" token at the start of a chunk
HARD_SLACK = 4  # a cut inside a word: measured at most 2 on SmolLM2's BPE, twice that allowed


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


def chunks(text: str, size: int = CHUNK_CHARS) -> Iterator[tuple[str, bool]]:
    """``text`` in pieces of at most ``size`` characters; with each, whether the cut after it
    fell at a space between words (True) or inside a word."""
    start = 0
    while len(text) - start > size:
        end = start + size
        cut = _space_between_words(text, max(start + 1, end - CUT_WINDOW), end)
        yield text[start : cut or end], cut is not None
        start = cut or end
    yield text[start:], True


def _space_between_words(text: str, low: int, high: int) -> int | None:
    k = text.rfind(" ", low, high)
    while k > low:
        if not text[k - 1].isspace() and not text[k + 1].isspace():
            return k
        k = text.rfind(" ", low, k)
    return None


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
) -> list[int]:
    """``text``'s token ids, or the budget's refusal, found without encoding far past it."""
    specials = tok.num_special_tokens if add_special_tokens else 0
    if budget is not None and len(text) > CHUNK_CHARS and upper_bound(text, specials) > budget.limit:
        # encode_batch releases the GIL: the screen runs beside the event loop.
        at_least = await asyncio.to_thread(screen, tok.count, text, budget.limit, specials)
        if at_least is not None:
            raise budget.refusal(at_least, param)
    return await tok.encode_async(text, add_special_tokens=add_special_tokens)
