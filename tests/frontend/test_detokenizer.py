"""Incremental detokenization with the real SmolLM2 (byte-level BPE) tokenizer."""

from __future__ import annotations

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from interlock.frontend.detokenizer import IncrementalDetokenizer
from interlock.frontend.tokenizer import ModelTokenizer

# Assigned characters but U+FFFD itself (surrogates are not encodable as UTF-8; the tokenizer's
# byte vocabulary cannot spell some unassigned code points, a loss in encoding, not decoding).
TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cn", "Co"), blacklist_characters="\ufffd"),
    max_size=40,
)


def stream(tok: ModelTokenizer, ids: list[int], chunk: int = 1, prompt: tuple[int, ...] = ()) -> list[str]:
    detok = IncrementalDetokenizer(tok, prompt)
    pieces = [detok.push(ids[i : i + chunk]) for i in range(0, len(ids), chunk)]
    return [*pieces, detok.flush()]


def test_character_split_over_tokens_is_held_until_complete(tok: ModelTokenizer) -> None:
    ids = tok.encode("日本語 😀", add_special_tokens=False)
    assert len(ids) > 4  # the byte-level tokenizer splits these characters over tokens
    pieces = stream(tok, ids)
    assert "".join(pieces) == "日本語 😀"
    assert all("\ufffd" not in p for p in pieces)
    assert "" in pieces  # some tokens held back an incomplete character


def test_leading_space_after_prompt_context(tok: ModelTokenizer) -> None:
    prompt = tok.encode("Hello", add_special_tokens=False)
    ids = tok.encode(" world, again", add_special_tokens=False)
    assert "".join(stream(tok, ids, prompt=tuple(prompt))) == " world, again"


def test_special_tokens_are_skipped(tok: ModelTokenizer) -> None:
    ids = tok.encode("Hi", add_special_tokens=False) + [tok.eos_token_ids[0]]
    assert "".join(stream(tok, ids)) == "Hi"


def test_incomplete_tail_is_flushed_at_the_end(tok: ModelTokenizer) -> None:
    ids = tok.encode("😀", add_special_tokens=False)
    pieces = stream(tok, ids[:-1])
    assert pieces[:-1] == [""] * (len(ids) - 1)
    assert pieces[-1] == "\ufffd"  # the model stopped mid-character: say so, once, at the end


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=TEXT, chunk=st.integers(min_value=1, max_value=3))
def test_never_emits_replacement_char_and_reassembles(tok: ModelTokenizer, text: str, chunk: int) -> None:
    ids = tok.encode(text, add_special_tokens=False)
    assume(tok.decode(ids) == text)
    pieces = stream(tok, ids, chunk)
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == tok.decode(ids)


def test_streamed_text_is_the_tokenizers_decode_of_any_ids(tok: ModelTokenizer) -> None:
    """Byte-level tokenizers stream through a table of token bytes and an incremental UTF-8
    decoder: whatever the ids (special ones, characters split over tokens, bytes no character
    can have, ids past the vocabulary) and however they are chunked, the text is the
    tokenizer's own ``decode`` of them."""
    import copy
    import random

    assert tok.byte_table(True) is not None
    contextual = copy.copy(tok)  # the same tokenizer through the two-decode path other kinds take
    contextual._byte_decoder = None
    assert contextual.byte_table(True) is None
    rng = random.Random(7)
    vocab = tok.vocab_size
    for n in range(400):
        t = contextual if n % 4 == 3 else tok
        ids = [
            rng.randrange(vocab) if rng.random() < 0.9 else rng.randrange(20)
            for _ in range(rng.randint(1, 30))
        ]
        ids += [vocab + 3] if rng.random() < 0.05 else []
        for skip in (True, False):
            detok = IncrementalDetokenizer(t, (), skip_special_tokens=skip)
            parts, i = [], 0
            while i < len(ids):
                k = rng.randint(1, 3)
                parts.append(detok.push(ids[i : i + k]))
                i += k
            parts.append(detok.flush())
            assert "".join(parts) == tok.tokenizer.decode(ids, skip_special_tokens=skip)
            assert all(p.count("\ufffd") <= "".join(parts).count("\ufffd") for p in parts)
