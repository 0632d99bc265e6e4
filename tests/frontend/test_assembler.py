"""Output chunks -> text deltas, counts, finish reasons and errors."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from interlock.errors import EngineError, NoWorkers
from interlock.frontend.assembler import OutputAssembler, error_from_info
from interlock.frontend.tokenizer import ModelTokenizer
from interlock.protocol import ErrorInfo, GenerateOutput


def out(ids: list[int], finish: str | None = None, cached: int = 0) -> GenerateOutput:
    return GenerateOutput(
        request_id="r", token_ids=tuple(ids), finish_reason=finish, num_cached_tokens=cached
    )


def test_counts_text_and_finish(tok: ModelTokenizer) -> None:
    ids = tok.encode("Hello there, friend", add_special_tokens=False)
    a = OutputAssembler(tok, [1, 2, 3])
    texts = [a.push(out(ids[:2], cached=2)).text, a.push(out(ids[2:], "length")).text]
    assert "".join(texts) == "Hello there, friend"
    assert (a.prompt_tokens, a.completion_tokens, a.cached_tokens, a.finish_reason) == (
        3,
        len(ids),
        2,
        "length",
    )


def test_stop_string_sets_stop_and_drops_the_rest(tok: ModelTokenizer) -> None:
    ids = tok.encode("one. two. three", add_special_tokens=False)
    a = OutputAssembler(tok, [], stop=[". t"])
    deltas = [a.push(out([t])) for t in ids]
    assert "".join(d.text for d in deltas) == "one"
    assert deltas[-1].finish_reason == "stop" and a.finish_reason == "stop"


def test_error_chunks_raise_the_named_error(tok: ModelTokenizer) -> None:
    a = OutputAssembler(tok, [])
    with pytest.raises(NoWorkers, match="gone"):
        a.push(
            GenerateOutput(
                request_id="r", finish_reason="error", error=ErrorInfo(code="no_workers", message="gone")
            )
        )
    assert isinstance(error_from_info(ErrorInfo(code="no_such_error", message="x")), EngineError)
    assert isinstance(error_from_info(None), EngineError)
    # the field an engine-side error is about reaches the client's error.param
    err = error_from_info(
        ErrorInfo(code="prompt_too_long", message="too long", status=400, param="max_tokens")
    )
    assert (type(err).__name__, err.param) == ("PromptTooLong", "max_tokens")


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    text=st.text(alphabet="ab cé日😀\n", min_size=1, max_size=30),
    stop=st.text(alphabet="ab cé日😀\n", min_size=1, max_size=4),
    chunk=st.integers(min_value=1, max_value=3),
)
def test_stream_equals_text_cut_at_first_stop(tok: ModelTokenizer, text: str, stop: str, chunk: int) -> None:
    ids = tok.encode(text, add_special_tokens=False)
    a = OutputAssembler(tok, [], stop=[stop])
    pieces = []
    for i in range(0, len(ids), chunk):
        last = i + chunk >= len(ids)
        delta = a.push(out(ids[i : i + chunk], "length" if last else None))
        pieces.append(delta.text)
        if delta.finish_reason is not None:
            break
    cut = text.find(stop)
    assert "".join(pieces) == (text if cut < 0 else text[:cut])
    assert a.finish_reason == ("length" if cut < 0 else "stop")
    assert all("\ufffd" not in p for p in pieces)
