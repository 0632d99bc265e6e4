"""Chunked encoding: ids equal to the whole text's on every kind of text, the tokenizers that
qualify and those that do not, the cache, and the budget counted as chunks come."""

from __future__ import annotations

import asyncio
import json
import random
import shutil
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from interlock.errors import PromptTooLong
from interlock.frontend.budget import TokenBudget, encode_pieces, encode_within
from interlock.frontend.chunked import (
    CHUNK_CHARS,
    ENTRY_TOKENS,
    PARALLEL_CHARS,
    ChunkCache,
    ChunkedEncoder,
    Plan,
    pipeline_spec,
    read_spec,
    seams_exact,
    soft_pieces,
    special_prefix,
)
from interlock.frontend.tokenizer import ModelTokenizer, load_tokenizer

LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PIECES = [
    "word", "Word", "WORD", "it's", "we'll", "3.14", "12345678", "-42", "ünïcödé", "naïve",
    "中文字符", "日本語", "😀", "👍🏽", "∑∫√", "https://x.org/a?b=c", "snake_case", "(x)", "[y]",
    "{z: 1}", '"q"', "'s", "...", "—", "<|im_start|>", "<|im_end|>", "\t", "\n", "\n\n", "  ",
    "   ", "\r\n", "\u00a0", "a\u0301", "x" * 40,
]  # fmt: skip


def random_text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(PIECES) + rng.choice([" ", " ", " ", "", "\n", "  "]) for _ in range(n))


def with_pre_tokenizer(tok: Tokenizer, pre: object, **more: object) -> Tokenizer:
    spec = read_spec(tok)
    spec["pre_tokenizer"] = pre
    spec.update(more)
    return Tokenizer.from_str(json.dumps(spec))


def llama3_style(tok: Tokenizer) -> Tokenizer:
    return with_pre_tokenizer(
        tok,
        {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": LLAMA3_SPLIT},
                    "behavior": "Isolated",
                    "invert": False,
                },
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
            ],
        },
    )


def whole(tok: Tokenizer, text: str) -> tuple[int, ...]:
    return tuple(tok.encode(text, add_special_tokens=False).ids)


@pytest.mark.parametrize("style", ["gpt2", "llama3"])
def test_pieces_joined_are_the_whole_texts_ids_on_random_texts(tok: ModelTokenizer, style: str) -> None:
    tokenizer = tok.tokenizer if style == "gpt2" else llama3_style(tok.tokenizer)
    assert seams_exact(tokenizer, read_spec(tokenizer))
    enc = ChunkedEncoder(tokenizer)
    rng = random.Random(11)
    seams = 0
    for _ in range(200):
        text = random_text(rng, rng.randint(20, 400))
        pieces = soft_pieces(text, size=rng.randint(40, 200))
        if pieces is None:
            continue
        seams += len(pieces) - 1
        assert "".join(pieces) == text
        assert tuple(i for ids in enc.encode(pieces) for i in ids) == whole(tokenizer, text)
    assert seams > 800


def test_tokenizers_whose_ids_could_change_at_a_cut_keep_whole_encoding(tok: ModelTokenizer) -> None:
    base = tok.tokenizer
    metaspace = with_pre_tokenizer(
        base, {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always"}
    )
    assert not seams_exact(metaspace, read_spec(metaspace))
    nfkc = with_pre_tokenizer(base, read_spec(base)["pre_tokenizer"], normalizer={"type": "NFKC"})
    assert not seams_exact(nfkc, read_spec(nfkc))
    spec = read_spec(base)
    spec["added_tokens"][0]["rstrip"] = True  # would eat the space that starts the next chunk
    stripping = Tokenizer.from_str(json.dumps(spec))
    assert not seams_exact(stripping, read_spec(stripping))
    no_regex = with_pre_tokenizer(base, {**read_spec(base)["pre_tokenizer"], "use_regex": False})
    assert not seams_exact(no_regex, read_spec(no_regex))


def test_a_text_without_spaces_between_words_has_no_soft_pieces() -> None:
    assert soft_pieces("a" * (3 * CHUNK_CHARS)) is None
    assert soft_pieces("short text") == ["short text"]
    sparse = ("x" * 1500 + " ") * 40  # a space every 1,500 characters: some cuts fall inside a word
    pieces = soft_pieces(sparse)
    assert pieces is not None and "".join(pieces) == sparse and len(pieces) > 1
    assert all(p.startswith(" x") for p in pieces[1:])  # joined back up to a space between words


def test_special_prefix_is_what_add_special_tokens_puts_in_front(tok: ModelTokenizer) -> None:
    assert special_prefix(tok.tokenizer) == []  # SmolLM2 adds nothing
    spec = read_spec(tok.tokenizer)
    bos = {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}
    seq = {"Sequence": {"id": "A", "type_id": 0}}
    eot = {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [0], "tokens": ["<|endoftext|>"]}}
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [bos, seq],
        "pair": [bos, seq],
        "special_tokens": eot,
    }
    assert special_prefix(Tokenizer.from_str(json.dumps(spec))) == [0]
    spec["post_processor"]["single"] = [bos, seq, bos]  # one after the text too: not a prefix
    assert special_prefix(Tokenizer.from_str(json.dumps(spec))) is None


def test_cache_is_bounded_in_tokens_and_drops_the_least_recently_used() -> None:
    e = ENTRY_TOKENS  # each entry's own cost, in ids
    cache = ChunkCache(capacity=10 + 2 * e)
    cache.put((1, 1), [1, 2, 3, 4])
    cache.put((2, 1), [5, 6, 7, 8])
    assert cache.get((1, 1)) is not None  # a is now the most recent
    cache.put((3, 1), [9, 10, 11])
    assert cache.get((2, 1)) is None and cache.tokens == 7 + 2 * e and len(cache) == 2
    cache.put((4, 1), list(range(11 + 2 * e)))  # larger than the whole cache: not kept
    assert cache.get((4, 1)) is None and cache.tokens == 7 + 2 * e


def test_tiny_pieces_count_their_entries_so_the_cache_stays_bounded_in_memory() -> None:
    cache = ChunkCache(capacity=100 * ENTRY_TOKENS)
    for i in range(10_000):  # a client sending one-token messages
        cache.put((i, 1), [i])
    assert len(cache) < 100


def plan(enc: ChunkedEncoder, text: str) -> Plan:
    planned = enc.plan(text)
    assert planned is not None
    return planned


class Counting(ChunkedEncoder):
    """Records what it is asked to encode."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        super().__init__(tokenizer, ChunkCache())
        self.encoded: list[str] = []

    def encode(self, pieces: list[str]) -> list[list[int]]:
        self.encoded += pieces
        return super().encode(pieces)


def test_a_repeated_or_grown_text_encodes_only_what_is_new(tok: ModelTokenizer) -> None:
    enc = Counting(tok.tokenizer)
    rng = random.Random(5)
    text = random_text(rng, 30_000)
    pieces = soft_pieces(text)
    assert pieces is not None and len(pieces) > 5
    first = asyncio.run(encode_pieces(enc, plan(enc, text), [], None))
    assert first == whole(tok.tokenizer, text) and len(enc.encoded) == len(pieces)
    again = asyncio.run(encode_pieces(enc, plan(enc, text), [], None))
    assert again == first and len(enc.encoded) == len(pieces)  # all from the cache
    grown = text + " and the next turn of the conversation."
    ids = asyncio.run(encode_pieces(enc, plan(enc, grown), [7], None))
    assert ids == (7, *whole(tok.tokenizer, grown))
    assert enc.encoded[len(pieces) :] == [plan(enc, grown)[0][-1]]  # only the last piece was new


def test_the_count_stops_near_the_budget_and_proves_the_refusal(tok: ModelTokenizer) -> None:
    enc = Counting(tok.tokenizer)
    text = random_text(random.Random(8), 60_000)
    exact = len(whole(tok.tokenizer, text))
    assert asyncio.run(encode_pieces(enc, plan(enc, text), [], exact)) == whole(tok.tokenizer, text)
    enc = Counting(tok.tokenizer)
    at_least = asyncio.run(encode_pieces(enc, plan(enc, text), [], 500))
    assert isinstance(at_least, int) and 500 < at_least <= exact
    assert sum(map(len, enc.encoded)) < 0.25 * len(text)  # stopped early
    assert asyncio.run(encode_pieces(enc, plan(enc, text), [], exact - 1)) == exact  # the cache counts too


def test_encode_within_through_the_model_tokenizer(tok: ModelTokenizer) -> None:
    assert tok.chunked is not None
    text = random_text(random.Random(9), 20_000)
    ids = asyncio.run(encode_within(tok, text, add_special_tokens=False, budget=None, param="messages"))
    assert ids == whole(tok.tokenizer, text)
    with pytest.raises(PromptTooLong, match="at least"):
        asyncio.run(
            encode_within(
                tok, text, add_special_tokens=False, budget=TokenBudget(None, 2048), param="messages"
            )
        )


def test_a_tokenizer_that_does_not_qualify_is_screened_then_encoded_whole(
    tok: ModelTokenizer, smol_path: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "model"
    shutil.copytree(smol_path, folder, ignore=shutil.ignore_patterns("*.safetensors", "*.gguf"))
    spec = read_spec(tok.tokenizer)
    spec["pre_tokenizer"] = {**spec["pre_tokenizer"], "use_regex": False}
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    other = load_tokenizer(folder)
    assert other.chunked is None
    text = random_text(random.Random(10), 20_000)
    ids = asyncio.run(encode_within(other, text, add_special_tokens=False, budget=None, param="messages"))
    assert list(ids) == other.tokenizer.encode(text, add_special_tokens=False).ids
    with pytest.raises(PromptTooLong):
        asyncio.run(
            encode_within(
                other, text, add_special_tokens=False, budget=TokenBudget(None, 2048), param="messages"
            )
        )


def test_a_prompt_sent_again_is_the_same_tuple_and_still_meets_the_budget(tok: ModelTokenizer) -> None:
    text = random_text(random.Random(12), 12_000)
    first = asyncio.run(encode_within(tok, text, add_special_tokens=False, budget=None, param="messages"))
    again = asyncio.run(encode_within(tok, text, add_special_tokens=False, budget=None, param="messages"))
    assert isinstance(first, tuple) and again is first
    assert tok.chunked is not None
    big = next(t for t in first if t > 256)  # ids point at one int object per token id
    assert big is tok.chunked.shared([int(str(big))])[0]
    with pytest.raises(PromptTooLong, match=f"at least {len(first)} tokens"):  # from the memo
        asyncio.run(
            encode_within(
                tok, text, add_special_tokens=False, budget=TokenBudget(None, len(first)), param="messages"
            )
        )


MARKS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<filename>", "<|im_start|>user\n"]


@pytest.mark.parametrize("style", ["gpt2", "llama3"])
def test_a_short_text_cut_at_its_added_tokens_encodes_as_the_whole(tok: ModelTokenizer, style: str) -> None:
    tokenizer = tok.tokenizer if style == "gpt2" else llama3_style(tok.tokenizer)
    enc = ChunkedEncoder(tokenizer)
    assert enc.cuts is not None
    rng = random.Random(5)
    cuts = 0
    for _ in range(300):
        parts = [random_text(rng, rng.randint(0, 30)) for _ in range(rng.randint(1, 8))]
        glue = [rng.choice([*MARKS, "", "<|im_end", "|im_start|>"]) for _ in parts]  # and near-misses
        text = "".join(p + g for p, g in zip(parts, glue, strict=True))
        if rng.random() < 0.3:
            text = rng.choice(MARKS) + text  # at the very start
        plan = enc.cut_plan(text)
        assert plan is not None
        cuts += len(plan.parts) // 2
        assert enc.fill(plan) == whole(tokenizer, text)
    assert cuts > 500


def test_a_conversations_next_turn_encodes_only_its_new_messages(tok: ModelTokenizer) -> None:
    enc = ChunkedEncoder(tok.tokenizer)
    system = "<|im_start|>system\nYou are terse. Answer in one line.<|im_end|>\n"
    turns = [f"<|im_start|>user\nquestion {i} about caching?<|im_end|>\n" for i in range(4)]
    chat = system
    for i, turn in enumerate(turns):
        chat += turn
        text = chat + "<|im_start|>assistant\n"
        plan = enc.cut_plan(text)
        assert plan is not None
        new = [plan.parts[j] for j in plan.missing]
        # the first request encodes every piece; later ones only the messages new since the last
        first = {
            "system\nYou are terse. Answer in one line.",
            "\n",
            "user\nquestion 0 about caching?",
            "assistant\n",
        }
        later = [f"assistant\nanswer {i - 1}", f"user\nquestion {i} about caching?"]  # the last answer too
        assert set(new) == first if i == 0 else new == later
        assert enc.fill(plan) == whole(tok.tokenizer, text)
        chat += f"<|im_start|>assistant\nanswer {i}<|im_end|>\n"


def test_added_tokens_matched_after_normalizing_or_stripping_are_not_cuts(tok: ModelTokenizer) -> None:
    spec = read_spec(tok.tokenizer)
    spec["added_tokens"][2]["lstrip"] = True  # <|im_end|> eats the spaces before it
    tokenizer = Tokenizer.from_str(json.dumps(spec))
    enc = ChunkedEncoder(tokenizer)
    assert enc.cuts is not None and "<|im_end|>" not in enc.cuts.ids and "<|im_start|>" in enc.cuts.ids
    text = "<|im_start|>user\nhi   <|im_end|>\n<|im_start|>assistant\n"
    plan = enc.cut_plan(text)
    assert plan is not None and enc.fill(plan) == whole(tokenizer, text)
    assert whole(tokenizer, text) != whole(tok.tokenizer, text)  # the stripping did change the ids


def test_encode_within_uses_the_cuts_for_chats_and_completions(tok: ModelTokenizer) -> None:
    enc = tok.chunked
    assert enc is not None and enc.cuts is not None and tok.special_prefix is not None
    text = "<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n"
    for specials in (False, True):
        got = asyncio.run(
            encode_within(tok, text, add_special_tokens=specials, budget=None, param="messages")
        )
        assert list(got) == tok.encode(text, add_special_tokens=specials)
    assert ChunkCache.key("user\nhello there") in enc.cache._entries
    rng = random.Random(3)  # a long new message (past LONG_TEXT_CHARS): encoded off the event loop
    long = "<|im_start|>user\n" + random_text(rng, 2500)[: CHUNK_CHARS - 40] + "<|im_end|>\n"
    plan = enc.cut_plan(long)
    assert plan is not None and plan.missing_chars >= PARALLEL_CHARS
    got = asyncio.run(encode_within(tok, long, add_special_tokens=False, budget=None, param="messages"))
    assert list(got) == tok.encode(long, add_special_tokens=False)


@pytest.mark.parametrize("style", ["gpt2", "llama3", "nfkc", "stripping"])
def test_the_pipeline_spec_is_the_whole_descriptions_parts(tok: ModelTokenizer, style: str) -> None:
    tokenizer = tok.tokenizer
    if style == "llama3":
        tokenizer = llama3_style(tokenizer)
    elif style == "nfkc":
        tokenizer = with_pre_tokenizer(
            tokenizer, read_spec(tokenizer)["pre_tokenizer"], normalizer={"type": "NFKC"}
        )
    elif style == "stripping":
        spec = read_spec(tokenizer)
        spec["added_tokens"][0]["rstrip"] = True
        tokenizer = Tokenizer.from_str(json.dumps(spec))
    whole, light = read_spec(tokenizer), pipeline_spec(tokenizer)
    assert light["normalizer"] == whole["normalizer"] and light["pre_tokenizer"] == whole["pre_tokenizer"]
    keys = ("id", "content", "lstrip", "rstrip", "special")
    assert light["added_tokens"] == [{k: t[k] for k in keys} for t in whole["added_tokens"]]
    assert seams_exact(tokenizer, light) == seams_exact(tokenizer, whole) == (style in ("gpt2", "llama3"))
