"""The token budget: the byte bound, the cuts, the screen that stops at the limit, the refusals."""

from __future__ import annotations

import asyncio
import random

import pytest

from interlock.errors import LimitExceeded, PromptTooLong
from interlock.frontend.budget import (
    CHUNK_CHARS,
    HARD_SLACK,
    TokenBudget,
    chunks,
    encode_within,
    screen,
    upper_bound,
)
from interlock.frontend.tokenizer import ModelTokenizer


def words(n_chars: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    vocab = [
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(1, 10)))
        for _ in range(500)
    ]
    text = " ".join(rng.choice(vocab) for _ in range(n_chars // 3))
    return text[:n_chars]


def test_the_limit_is_the_smaller_of_max_prompt_tokens_and_the_room_in_the_context() -> None:
    assert TokenBudget(None, 2048).limit == 2047  # one token must fit after the prompt
    assert TokenBudget(100, 2048).limit == 100
    assert TokenBudget(5000, 2048).limit == 2047


def test_a_token_is_at_least_one_byte() -> None:
    assert upper_bound("hello", 0) == 5
    assert upper_bound("héllo 😀", 1) == len("héllo 😀".encode()) + 1


def test_chunks_cut_at_a_space_between_words_else_inside_a_word() -> None:
    text = words(3 * CHUNK_CHARS + 123)
    pieces = list(chunks(text))
    assert "".join(p for p, _ in pieces) == text
    assert all(soft for _, soft in pieces) and all(len(p) <= CHUNK_CHARS for p, _ in pieces)
    assert all(p.startswith(" ") and not p[1].isspace() for p, _ in pieces[1:])  # " word" starts each
    solid = "a" * (2 * CHUNK_CHARS + 5)
    assert [(len(p), soft) for p, soft in chunks(solid)] == [
        (CHUNK_CHARS, False),
        (CHUNK_CHARS, False),
        (5, True),
    ]


def test_the_screen_stops_once_the_count_passes_the_limit() -> None:
    counted: list[str] = []

    def count(piece: str) -> int:
        counted.append(piece)
        return len(piece.split())

    text = words(10 * CHUNK_CHARS)
    at_least = screen(count, text, limit=100, specials=1)
    assert len(counted) == 1  # one chunk holds ~4,000 words: over at once, the rest never encoded
    assert at_least is not None and at_least > 100
    assert at_least == 1 + len(counted[0].split())
    counted.clear()
    assert screen(count, text, limit=10**6, specials=0) is None
    assert len(counted) == len(list(chunks(text)))


def test_each_cut_is_allowed_its_slack_before_the_count_proves_anything() -> None:
    solid = "a" * (2 * CHUNK_CHARS + 5)  # one token a character, cut twice inside the "word"
    calls: list[int] = []

    def inflated(piece: str) -> int:  # each cut costs HARD_SLACK tokens more than the whole has
        calls.append(len(piece))
        return len(piece) + (HARD_SLACK if len(calls) > 1 else 0)

    assert screen(inflated, solid, limit=len(solid), specials=0) is None  # at the limit: passes
    # Over after two pieces and one cut: the last piece is never encoded.
    assert screen(len, solid, limit=len(solid) - 20, specials=0) == 2 * CHUNK_CHARS - HARD_SLACK


def test_chunked_counts_are_the_whole_texts_on_smollm2(tok: ModelTokenizer) -> None:
    text = words(5 * CHUNK_CHARS, seed=3)
    assert sum(tok.count(p) for p, _ in chunks(text)) == len(tok.encode(text, add_special_tokens=False))


def test_a_prompt_at_the_limit_passes_and_one_over_it_is_refused_naming_the_limit(
    tok: ModelTokenizer,
) -> None:
    text = words(3 * CHUNK_CHARS, seed=5)
    exact = len(tok.encode(text, add_special_tokens=True))

    def encode(budget: TokenBudget) -> list[int]:
        return asyncio.run(encode_within(tok, text, add_special_tokens=True, budget=budget, param="prompt"))

    assert len(encode(TokenBudget(exact, 10**6))) == exact
    assert len(encode(TokenBudget(None, exact + 1))) == exact
    with pytest.raises(
        LimitExceeded, match=r"at least \d+ tokens; this server accepts at most 1000 \(max_prompt_tokens\)"
    ):
        encode(TokenBudget(1000, 10**6))
    with pytest.raises(
        PromptTooLong, match=r"maximum context length is 2048 tokens.*at least \d+ tokens"
    ) as info:
        encode(TokenBudget(None, 2048))
    assert info.value.param == "prompt"
