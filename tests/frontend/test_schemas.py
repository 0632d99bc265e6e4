"""Decoding and validating OpenAI request bodies."""

from __future__ import annotations

import json
import re
import typing
from typing import Any

import httpx
import msgspec
import pytest

from interlock.errors import InvalidRequest, LimitExceeded
from interlock.frontend import FakeScript
from interlock.frontend.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    chat_messages,
    completion_prompt,
    parse_chat,
    parse_completion,
    stop_strings,
)
from interlock.frontend.tokenizer import ModelTokenizer
from tests.frontend.conftest import MODEL, SMALL_MODEL, Served


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
        parse_chat(
            body(model="m", messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}])
        )
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


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"top_k": 2**64}, "top_k"),
        ({"top_k": 2**31}, "top_k"),
        ({"stop_token_ids": [1, 2**70]}, "stop_token_ids"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ],
)
def test_integers_msgpack_cannot_carry_are_refused(fields: dict[str, object], param: str) -> None:
    # Found by the schemathesis run: top_k = 6.7e35 got through and failed the dispatcher's
    # msgpack encode (a 500).
    for parse, extra in ((parse_completion, {"prompt": "p"}), (parse_chat, {"messages": [{"role": "user"}]})):
        with pytest.raises(InvalidRequest) as info:
            parse(body(model="m", **extra, **fields))
        assert info.value.param is not None and info.value.param.startswith(param)


# ---- every field either shapes the output or is refused ----
# For each field of each request struct (nested ones included): a body that sets it, and the
# body it is compared with. Setting it must change what the backend receives or what the client
# reads, or be refused with a 400 naming it. A new field fails ``test_the_table_covers_...``
# until it is listed here.
SCRIPT_TEXT = "hello world again and again"
CHAT_BASE: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}
COMPLETION_BASE: dict[str, Any] = {"model": MODEL, "prompt": "Hi", "max_tokens": 8}
SAMPLING: dict[str, dict[str, Any]] = {
    "model": {"model": SMALL_MODEL},
    "max_tokens": {"max_tokens": 3},
    "stop": {"stop": " world"},
    "stop_token_ids": {"stop_token_ids": [5]},
    "temperature": {"temperature": 0.1},
    "top_p": {"top_p": 0.5},
    "top_k": {"top_k": 5},
    "min_p": {"min_p": 0.1},
    "seed": {"seed": 7},
    "n": {"n": 2},
    "stream": {"stream": True},
    "stream_options": {"stream_options": {"include_usage": True}},
    "ignore_eos": {"ignore_eos": True},
    "min_tokens": {"min_tokens": 2},
    "skip_special_tokens": {"skip_special_tokens": False},
    "presence_penalty": {"presence_penalty": 0.5},
    "frequency_penalty": {"frequency_penalty": 0.5},
    "repetition_penalty": {"repetition_penalty": 1.3},
    "priority": {"priority": 3},
}
# ``user`` identifies the end user for the logs and, as at OpenAI, never changes the output.
NO_EFFECT_BY_DESIGN = {"ChatCompletionRequest.user", "CompletionRequest.user"}
STREAMED = {"stream": True}
VARIANTS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    **{f"ChatCompletionRequest.{k}": (CHAT_BASE, {**CHAT_BASE, **v}) for k, v in SAMPLING.items()},
    **{f"CompletionRequest.{k}": (COMPLETION_BASE, {**COMPLETION_BASE, **v}) for k, v in SAMPLING.items()},
    "ChatCompletionRequest.messages": (
        CHAT_BASE,
        {**CHAT_BASE, "messages": [{"role": "user", "content": "Yo"}]},
    ),
    "ChatCompletionRequest.max_completion_tokens": (CHAT_BASE, {**CHAT_BASE, "max_completion_tokens": 3}),
    "ChatCompletionRequest.logprobs": (CHAT_BASE, {**CHAT_BASE, "logprobs": True}),
    "ChatCompletionRequest.top_logprobs": (CHAT_BASE, {**CHAT_BASE, "top_logprobs": 2}),
    "ChatCompletionRequest.add_generation_prompt": (CHAT_BASE, {**CHAT_BASE, "add_generation_prompt": False}),
    "ChatCompletionRequest.tools": (CHAT_BASE, {**CHAT_BASE, "tools": [{"type": "function"}]}),
    "ChatCompletionRequest.tool_choice": (CHAT_BASE, {**CHAT_BASE, "tool_choice": "auto"}),
    "ChatCompletionRequest.response_format": (
        CHAT_BASE,
        {**CHAT_BASE, "response_format": {"type": "json_object"}},
    ),
    "ChatMessage.role": (CHAT_BASE, {**CHAT_BASE, "messages": [{"role": "system", "content": "Hi"}]}),
    "ChatMessage.content": (CHAT_BASE, {**CHAT_BASE, "messages": [{"role": "user", "content": "Yo"}]}),
    "ContentPart.type": (
        {**CHAT_BASE, "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]},
        {**CHAT_BASE, "messages": [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}]},
    ),
    "ContentPart.text": (
        {**CHAT_BASE, "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]},
        {**CHAT_BASE, "messages": [{"role": "user", "content": [{"type": "text", "text": "Yo"}]}]},
    ),
    "StreamOptions.include_usage": (
        {**CHAT_BASE, **STREAMED, "stream_options": {"include_usage": False}},
        {**CHAT_BASE, **STREAMED, "stream_options": {"include_usage": True}},
    ),
    "CompletionRequest.prompt": (COMPLETION_BASE, {**COMPLETION_BASE, "prompt": "Yo"}),
    "CompletionRequest.logprobs": (COMPLETION_BASE, {**COMPLETION_BASE, "logprobs": 1}),
    "CompletionRequest.echo": (COMPLETION_BASE, {**COMPLETION_BASE, "echo": True}),
    "CompletionRequest.best_of": (COMPLETION_BASE, {**COMPLETION_BASE, "best_of": 2}),
    "CompletionRequest.suffix": (COMPLETION_BASE, {**COMPLETION_BASE, "suffix": "s"}),
}


def struct_fields(root: type) -> set[str]:
    """``Struct.field`` for every field of ``root`` and of the structs it contains."""
    names: set[str] = set()
    visited: set[type] = set()
    todo = [root]
    while todo:
        struct = todo.pop()
        visited.add(struct)
        for f in msgspec.structs.fields(struct):
            names.add(f"{struct.__name__}.{f.name}")
            todo.extend(t for t in _types_in(f.type) if t not in visited)
    return names


def _types_in(tp: Any) -> list[type]:
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return [tp]
    return [t for arg in typing.get_args(tp) for t in _types_in(arg)]


def test_the_table_covers_every_request_field() -> None:
    fields = struct_fields(ChatCompletionRequest) | struct_fields(CompletionRequest)
    assert fields == set(VARIANTS) | NO_EFFECT_BY_DESIGN


@pytest.mark.parametrize("field", sorted(VARIANTS))
def test_every_field_changes_the_output_or_is_refused(
    served: Served, tok: ModelTokenizer, field: str
) -> None:
    base, variant = VARIANTS[field]
    # A special token mid-text, so skip_special_tokens shows; stop ids from the script's own text.
    ids = tok.encode(SCRIPT_TEXT, add_special_tokens=False)
    served.script("walk", FakeScript(token_ids=(*ids[:2], 1, *ids[2:])))
    endpoint = "/v1/chat/completions" if field.split(".")[0] in CHAT_STRUCTS else "/v1/completions"
    with httpx.Client(base_url=served.url, timeout=20, headers={"x-route-key": "walk"}) as http:
        before, base_reply = outcome(http, served, endpoint, base)
        assert base_reply[0] == 200, base_reply
        after, reply = outcome(http, served, endpoint, variant)
    if reply[0] == 400:
        struct, name = field.split(".")
        param = json.loads(reply[1])["error"]["param"]
        assert param == name or param.startswith(NESTED_IN.get(struct, "\0")), (field, param)
        return
    assert reply[0] == 200, reply
    assert (after, reply) != (before, base_reply), f"{field} was accepted and changed nothing"


CHAT_STRUCTS = {"ChatCompletionRequest", "ChatMessage", "ContentPart", "StreamOptions"}
NESTED_IN = {"ChatMessage": "messages", "ContentPart": "messages", "StreamOptions": "stream_options"}


def outcome(
    http: httpx.Client, served: Served, endpoint: str, body: dict[str, Any]
) -> tuple[object, tuple[int, str]]:
    """What the backend received (without the request id) and what the client read (without
    ids and timestamps)."""
    count = len(served.backend.requests)
    r = http.post(endpoint, json=body)
    received = None
    if len(served.backend.requests) > count:
        received = msgspec.structs.replace(served.backend.requests[-1], request_id="")
    text = re.sub(r'"(id|created)":("[^"]*"|\d+)', "", r.text)
    return received, (r.status_code, text)
