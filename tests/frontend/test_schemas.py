"""Decoding and validating OpenAI request bodies."""

from __future__ import annotations

import json

import pytest

from interlock.errors import InvalidRequest, LimitExceeded
from interlock.frontend.schemas import (
    chat_messages,
    completion_prompt,
    parse_chat,
    parse_completion,
    stop_strings,
)


def body(**fields: object) -> bytes:
    return json.dumps(fields).encode()


def test_chat_fields() -> None:
    req = parse_chat(
        body(
            model="m",
            messages=[
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
            ],
            max_completion_tokens=5,
            stop="x",
            stream=True,
            stream_options={"include_usage": True},
            logprobs=True,
            top_logprobs=3,
            seed=7,
            tool_choice="none",
            response_format={"type": "text"},
        )
    )
    assert chat_messages(req) == [{"role": "user", "content": "ab"}]
    assert (req.max_completion_tokens, req.seed, req.top_logprobs) == (5, 7, 3)
    assert stop_strings(req) == ("x",)
    assert req.stream_options is not None and req.stream_options.include_usage


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (b"{not json", None),
        (b"[]", None),
        (body(messages=[{"role": "user", "content": "x"}]), "model"),
        (body(model="m", messages="hi"), "messages"),
        (body(model="m", messages=[{"role": "user", "content": "x"}], max_tokens="5"), "max_tokens"),
        (body(model="m", messages=[{"role": "user", "content": "x"}], temperature="hot"), "temperature"),
        (body(model="m", messages=[{"role": "user", "content": "x"}], n=2), "n"),
        (body(model="m", messages=[{"role": "user", "content": "x"}], top_logprobs=2), "top_logprobs"),
        (
            body(model="m", messages=[{"role": "user", "content": "x"}], presence_penalty=0.5),
            "presence_penalty",
        ),
        (body(model="m", messages=[]), "messages"),
    ],
)
def test_chat_rejections_name_the_field(raw: bytes, param: str | None) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_chat(raw)
    assert info.value.param == param


def test_image_parts_are_refused_at_parse() -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_chat(body(model="m", messages=[{"role": "user", "content": [{"type": "image_url"}]}]))
    assert "only text" in info.value.message and info.value.param == "messages[0].content"
    with pytest.raises(InvalidRequest) as info:
        parse_chat(body(model="m", messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]))
    assert info.value.param == "messages[0].content[0].image_url"


USER = [{"role": "user", "content": "x"}]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"metadata": {"anything": 1}}, "metadata"),
        ({"logit_bias": {"1": 5}}, "logit_bias"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"stream": True, "stream_options": {"include_usage": True, "x": 1}}, "stream_options.x"),
        ({"messages": [{"role": "user", "content": "x", "name": "bob"}]}, "messages[0].name"),
        ({"messages": [{"role": "assistant", "tool_calls": []}]}, "messages[0].tool_calls"),
        ({"priority": 2**64}, "priority"),
    ],
)
def test_chat_fields_not_honoured_are_refused_by_name(fields: dict[str, object], param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_chat(body(**{"model": "m", "messages": USER, **fields}))
    assert info.value.param == param


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize("depth", [33, 1000, 100_000])
def test_deep_nesting_is_refused(depth: int) -> None:
    for field in ("tools", "tool_choice", "response_format"):
        raw = b'{"model": "m", "messages": [], "' + field.encode() + b'": ' + nested(depth) + b"}"
        with pytest.raises(LimitExceeded, match="max_json_depth"):
            parse_chat(raw)
    with pytest.raises(LimitExceeded, match="max_json_depth"):
        parse_completion(b'{"model": "m", "prompt": ' + nested(depth) + b"}")
    with pytest.raises(InvalidRequest):  # a typed field refuses nesting at its first level
        parse_chat(b'{"model": "m", "messages": ' + nested(depth) + b"}")
    with pytest.raises(LimitExceeded):
        parse_completion(b'{"model": "m", "prompt": ' + nested(5) + b"}", max_depth=4)
    parse_completion(b'{"model": "m", "prompt": ' + nested(4) + b"}", max_depth=4)


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [("hi", "hi"), (["hi"], "hi"), ([1, 2, 3], [1, 2, 3]), ([[4, 5]], [4, 5])],
)
def test_completion_prompt_forms(prompt: object, expected: object) -> None:
    assert completion_prompt(parse_completion(body(model="m", prompt=prompt))) == expected


@pytest.mark.parametrize("prompt", [["a", "b"], [[1], [2]], [1, "a"], [-1], [], [True]])
def test_completion_prompt_rejections(prompt: object) -> None:
    with pytest.raises(InvalidRequest) as info:
        completion_prompt(parse_completion(body(model="m", prompt=prompt)))
    assert info.value.param == "prompt"


def test_completion_unsupported_options() -> None:
    for fields, param in (({"echo": True}, "echo"), ({"best_of": 2}, "best_of"), ({"suffix": "s"}, "suffix")):
        with pytest.raises(InvalidRequest) as info:
            parse_completion(body(model="m", prompt="p", **fields))
        assert info.value.param == param
