"""Decoding and validating OpenAI request bodies."""

from __future__ import annotations

import json
import re
import typing
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import msgspec
import pytest

from interlock.errors import InvalidRequest, LimitExceeded
from interlock.frontend import FakeScript
from interlock.frontend.fields import FIELDS, render_markdown
from interlock.frontend.response_schemas import (
    CHAT_COMPLETION,
    CHAT_COMPLETION_CHUNK,
    COMPLETION,
    ERROR,
    RESPONSE,
    RESPONSE_EVENT,
)
from interlock.frontend.responses_api import ResponsesRequest
from interlock.frontend.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    chat_messages,
    completion_prompt,
    completion_prompts,
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
        (body(model="m", messages=[{"role": "user", "content": "x"}], n=0), "n"),
        (body(model="m", messages=[{"role": "user", "content": "x"}], top_logprobs=2), "top_logprobs"),
        (
            body(model="m", messages=[{"role": "user", "content": "x"}], presence_penalty=3),
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
        ({"metadata": {"anything": 1}}, "metadata[...]"),
        ({"metadata": {str(i): "v" for i in range(17)}}, "metadata"),
        ({"logit_bias": {"x": 5}}, "logit_bias"),
        ({"logit_bias": {"1": 101}}, "logit_bias"),
        ({"tools": [{"type": "function", "function": {"name": "f g"}}]}, "tools[0].function.name"),
        (
            {
                "tools": [{"type": "function", "function": {"name": "f"}}],
                "tool_choice": "required",
                "response_format": {"type": "json_object"},
            },
            "response_format",
        ),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"stream": True, "stream_options": {"include_usage": True, "x": 1}}, "stream_options.x"),
        ({"messages": [{"role": "tool", "content": "4"}]}, "messages[0].tool_call_id"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": "4",
                        "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}],
                    }
                ]
            },
            "messages[0].tool_calls",
        ),
        ({"messages": [{"role": "function", "content": "4"}]}, "messages[0].role"),
        ({"priority": 2**64}, "priority"),
        ({"store": True}, "store"),
        ({"service_tier": "flex"}, "service_tier"),
        ({"reasoning_effort": "high"}, "reasoning_effort"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"audio": {"voice": "x"}}, "audio"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"echo": True}, "echo"),
        ({"continue_final_message": True, "add_generation_prompt": False}, "continue_final_message"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"spaces_between_special_tokens": False}, "spaces_between_special_tokens"),
        ({"structured_outputs": {"regex": "a+", "choice": ["a"]}}, "structured_outputs"),
        (
            {"structured_outputs": {"regex": "a+"}, "response_format": {"type": "json_object"}},
            "structured_outputs",
        ),
    ],
)
def test_chat_fields_not_honoured_are_refused_by_name(fields: dict[str, object], param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_chat(body(**{"model": "m", "messages": USER, **fields}))
    assert info.value.param == param


NEUTRAL: dict[str, object] = {
    "store": False,
    "metadata": {},
    "service_tier": "auto",
    "prompt_cache_key": "k",
    "safety_identifier": "u1",
    "reasoning_effort": "none",
    "logit_bias": {},
    "top_p": 0,
    "max_tokens": 16.0,
    "temperature": 1,
    "modalities": ["text"],
    "tool_choice": "none",
    "repetition_penalty": 1.0,
    "stop_token_ids": [],
    "messages": [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": "x", "name": "ann"},
        {"role": "assistant", "content": None, "refusal": "no", "tool_calls": []},
        {"role": "user", "content": [{"type": "text", "text": "y"}]},
    ],
}


def test_neutral_and_spec_valid_values_are_accepted() -> None:
    # What the SDKs and agent frameworks send by default, at values that ask for nothing new.
    req = parse_chat(body(model="m", **NEUTRAL))
    assert req.max_tokens == 16 and isinstance(req.max_tokens, int)
    messages = chat_messages(req)
    assert messages[0] == {"role": "system", "content": "be brief"}
    assert messages[1]["name"] == "ann" and messages[2]["content"] == "no"
    with pytest.raises(InvalidRequest) as info:  # a float that is no whole number is no count
        parse_chat(body(model="m", messages=USER, max_tokens=16.5))
    assert info.value.param == "max_tokens"
    with pytest.raises(InvalidRequest) as info:  # nor is a string, in the second pass either
        parse_chat(body(model="m", messages=USER, max_tokens=16.0, n="1"))
    assert info.value.param == "n"


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize("depth", [33, 1000, 100_000])
def test_deep_nesting_is_refused(depth: int) -> None:
    for field in ("tools", "tool_choice", "prediction"):
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


def test_completion_prompt_batches() -> None:
    assert completion_prompts(parse_completion(body(model="m", prompt=["a", "b"]))) == ["a", "b"]
    assert completion_prompts(parse_completion(body(model="m", prompt=[[1], "b"]))) == [[1], "b"]
    with pytest.raises(InvalidRequest) as info:  # one prompt is asked for where a batch is not allowed
        completion_prompt(parse_completion(body(model="m", prompt=["a", "b"])))
    assert info.value.param == "prompt"


@pytest.mark.parametrize("prompt", [[1, "a"], [-1], [], [True], [[]], [["a"]]])
def test_completion_prompt_rejections(prompt: object) -> None:
    with pytest.raises(InvalidRequest) as info:
        completion_prompt(parse_completion(body(model="m", prompt=prompt)))
    assert info.value.param == "prompt"


def test_completion_unsupported_options() -> None:
    for fields, param in (
        ({"best_of": 2, "n": 3}, "best_of"),
        ({"best_of": 2, "stream": True}, "best_of"),
        ({"suffix": "s"}, "suffix"),
    ):
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
    "stream_options": {"stream": True, "stream_options": {"include_usage": True}},
    "ignore_eos": {"ignore_eos": True},
    "min_tokens": {"min_tokens": 2},
    "skip_special_tokens": {"skip_special_tokens": False},
    "presence_penalty": {"presence_penalty": 0.5},
    "frequency_penalty": {"frequency_penalty": 0.5},
    "repetition_penalty": {"repetition_penalty": 1.3},
    "priority": {"priority": 3},
    "spaces_between_special_tokens": {"spaces_between_special_tokens": False},
    "include_stop_str_in_output": {"stop": " world", "include_stop_str_in_output": True},
    "logit_bias": {"logit_bias": {"5": 10}},
    "prompt_logprobs": {"prompt_logprobs": 1},
    "structured_outputs": {"structured_outputs": {"regex": "a+"}},
    "prompt_cache_key": {"prompt_cache_key": "conversation-1"},
    "store": {"store": True},
    "service_tier": {"service_tier": "flex"},
}
# ``user``, ``safety_identifier`` and ``metadata`` identify the end user and the request for the
# access log and, as at OpenAI, never change the output; a json_schema's ``name`` labels it and
# ``strict`` is always in force (the schema is enforced while decoding).
NO_EFFECT_BY_DESIGN = {name for name, field in FIELDS.items() if field.support == "log"}
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
CONVERSATION = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}
LOGPROBS: dict[str, Any] = {"logprobs": True, "top_logprobs": 1}
STREAMED = {"stream": True}
RESPONSES_BASE: dict[str, Any] = {"model": MODEL, "input": "Hi", "max_output_tokens": 8}
RESPONSES_TOOL = {"type": "function", "name": "get_weather", "parameters": SCHEMA}
VARIANTS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    **{f"ChatCompletionRequest.{k}": (CHAT_BASE, {**CHAT_BASE, **v}) for k, v in SAMPLING.items()},
    **{f"CompletionRequest.{k}": (COMPLETION_BASE, {**COMPLETION_BASE, **v}) for k, v in SAMPLING.items()},
    "ChatCompletionRequest.messages": (
        CHAT_BASE,
        {**CHAT_BASE, "messages": [{"role": "user", "content": "Yo"}]},
    ),
    "ChatCompletionRequest.max_completion_tokens": (CHAT_BASE, {**CHAT_BASE, "max_completion_tokens": 3}),
    "ChatCompletionRequest.logprobs": (CHAT_BASE, {**CHAT_BASE, "logprobs": True}),
    "ChatCompletionRequest.top_logprobs": ({**CHAT_BASE, "logprobs": True}, {**CHAT_BASE, **LOGPROBS}),
    "ChatCompletionRequest.add_generation_prompt": (CHAT_BASE, {**CHAT_BASE, "add_generation_prompt": False}),
    "ChatCompletionRequest.tools": (CHAT_BASE, {**CHAT_BASE, "tools": [TOOL]}),
    "ChatCompletionRequest.tool_choice": (
        {**CHAT_BASE, "tools": [TOOL]},
        {**CHAT_BASE, "tools": [TOOL], "tool_choice": "none"},
    ),
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
    "StreamOptions.continuous_usage_stats": (
        {**CHAT_BASE, **STREAMED, "stream_options": {"include_usage": True}},
        {**CHAT_BASE, **STREAMED, "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
    ),
    "ContentPart.refusal": (
        {
            **CHAT_BASE,
            "messages": [
                *CONVERSATION[:1],
                {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]},
            ],
        },
        {
            **CHAT_BASE,
            "messages": [
                *CONVERSATION[:1],
                {"role": "assistant", "content": [{"type": "refusal", "refusal": "never"}]},
            ],
        },
    ),
    "ChatMessage.name": (
        CHAT_BASE,
        {**CHAT_BASE, "messages": [{"role": "user", "content": "Hi", "name": "ann"}]},
    ),
    "ChatMessage.refusal": (
        {**CHAT_BASE, "messages": [*CONVERSATION[:1], {"role": "assistant", "refusal": "no"}]},
        {**CHAT_BASE, "messages": [*CONVERSATION[:1], {"role": "assistant", "refusal": "never"}]},
    ),
    "ChatMessage.tool_calls": (
        CHAT_BASE,
        {**CHAT_BASE, "messages": [*CONVERSATION, {"role": "assistant", "tool_calls": [CALL]}]},
    ),
    "ChatMessage.tool_call_id": (
        CHAT_BASE,
        {**CHAT_BASE, "messages": [*CONVERSATION, {"role": "tool", "content": "1", "tool_call_id": "c1"}]},
    ),
    **{
        f"{struct}.{name}": (
            CHAT_BASE,
            {**CHAT_BASE, "messages": [*CONVERSATION, {"role": "assistant", "tool_calls": [CALL]}]},
        )
        for struct, names in (
            ("MessageToolCall", ("id", "type", "function")),
            ("ToolCallFunction", ("name", "arguments")),
        )
        for name in names
    },
    "ChatCompletionRequest.continue_final_message": (
        {**CHAT_BASE, "messages": CONVERSATION, "add_generation_prompt": False},
        {
            **CHAT_BASE,
            "messages": CONVERSATION,
            "add_generation_prompt": False,
            "continue_final_message": True,
        },
    ),
    "ChatCompletionRequest.chat_template_kwargs": (
        CHAT_BASE,
        {**CHAT_BASE, "chat_template_kwargs": {"x": 1}},
    ),
    "ChatCompletionRequest.echo": (CHAT_BASE, {**CHAT_BASE, "echo": True}),
    "ChatCompletionRequest.parallel_tool_calls": (
        {**CHAT_BASE, "tools": [TOOL], "tool_choice": "required"},
        {**CHAT_BASE, "tools": [TOOL], "tool_choice": "required", "parallel_tool_calls": False},
    ),
    "ChatCompletionRequest.reasoning_effort": (CHAT_BASE, {**CHAT_BASE, "reasoning_effort": "high"}),
    "ChatCompletionRequest.verbosity": (CHAT_BASE, {**CHAT_BASE, "verbosity": "low"}),
    "ChatCompletionRequest.modalities": (CHAT_BASE, {**CHAT_BASE, "modalities": ["audio"]}),
    **{
        f"ChatCompletionRequest.{name}": (CHAT_BASE, {**CHAT_BASE, name: value})
        for name, value in (
            ("audio", {"voice": "alloy", "format": "mp3"}),
            ("prediction", {"type": "content", "content": "x"}),
            ("web_search_options", {}),
            ("functions", [{"name": "f"}]),
            ("function_call", "auto"),
        )
    },
    "ChatCompletionRequest.return_tokens_as_token_ids": (
        {**CHAT_BASE, **LOGPROBS},
        {**CHAT_BASE, **LOGPROBS, "return_tokens_as_token_ids": True},
    ),
    "CompletionRequest.return_tokens_as_token_ids": (
        {**COMPLETION_BASE, "logprobs": 1},
        {**COMPLETION_BASE, "logprobs": 1, "return_tokens_as_token_ids": True},
    ),
    "ResponseFormat.type": (CHAT_BASE, {**CHAT_BASE, "response_format": {"type": "json_object"}}),
    "ResponseFormat.json_schema": (
        {**CHAT_BASE, "response_format": {"type": "json_object"}},
        {
            **CHAT_BASE,
            "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}},
        },
    ),
    "JsonSchemaFormat.strict": (
        {
            **CHAT_BASE,
            "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}},
        },
        {
            **CHAT_BASE,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "a", "schema": SCHEMA, "strict": True},
            },
        },
    ),
    "TextFormat.strict": (
        {**RESPONSES_BASE, "text": {"format": {"type": "json_schema", "name": "a", "schema": SCHEMA}}},
        {
            **RESPONSES_BASE,
            "text": {"format": {"type": "json_schema", "name": "a", "schema": SCHEMA, "strict": True}},
        },
    ),
    "JsonSchemaFormat.schema": (
        {**CHAT_BASE, "response_format": {"type": "json_schema", "json_schema": {"name": "a"}}},
        {
            **CHAT_BASE,
            "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}},
        },
    ),
    "JsonSchemaFormat.description": (
        CHAT_BASE,
        {
            **CHAT_BASE,
            "response_format": {"type": "json_schema", "json_schema": {"name": "a", "description": "d"}},
        },
    ),
    **{
        f"StructuredOutputs.{name}": (
            COMPLETION_BASE,
            {**COMPLETION_BASE, "structured_outputs": {name: value}},
        )
        for name, value in (
            ("json", SCHEMA),
            ("regex", "[ab]+"),
            ("choice", ["yes", "no"]),
            ("grammar", 'root ::= "a"'),
            ("json_object", True),
        )
    },
    "CompletionRequest.prompt": (COMPLETION_BASE, {**COMPLETION_BASE, "prompt": "Yo"}),
    **{
        f"ResponsesRequest.{name}": (RESPONSES_BASE, {**RESPONSES_BASE, **change})
        for name, change in (
            ("model", {"model": SMALL_MODEL}),
            ("input", {"input": [{"role": "user", "content": [{"type": "input_text", "text": "Yo"}]}]}),
            ("instructions", {"instructions": "Be brief."}),
            ("max_output_tokens", {"max_output_tokens": 3}),
            ("temperature", {"temperature": 0.1}),
            ("top_p", {"top_p": 0.5}),
            ("tools", {"tools": [RESPONSES_TOOL]}),
            ("max_tool_calls", {"max_tool_calls": 1}),
            ("text", {"text": {"format": {"type": "json_object"}}}),
            ("stream", {"stream": True}),
            ("store", {"store": False}),
            ("previous_response_id", {"previous_response_id": "the base's id"}),
            ("prompt_cache_key", {"prompt_cache_key": "conversation-1"}),
            ("service_tier", {"service_tier": "flex"}),
            ("reasoning", {"reasoning": {"effort": "high"}}),
            ("truncation", {"truncation": "auto"}),
            ("include", {"include": ["message.output_text.logprobs"]}),
            ("background", {"background": True}),
        )
    },
    "ResponsesRequest.tool_choice": (
        {**RESPONSES_BASE, "tools": [RESPONSES_TOOL]},
        {**RESPONSES_BASE, "tools": [RESPONSES_TOOL], "tool_choice": "none"},
    ),
    "ResponsesRequest.parallel_tool_calls": (
        {**RESPONSES_BASE, "tools": [RESPONSES_TOOL], "tool_choice": "required"},
        {
            **RESPONSES_BASE,
            "tools": [RESPONSES_TOOL],
            "tool_choice": "required",
            "parallel_tool_calls": False,
        },
    ),
    "TextConfig.format": (RESPONSES_BASE, {**RESPONSES_BASE, "text": {"format": {"type": "json_object"}}}),
    "TextConfig.verbosity": (RESPONSES_BASE, {**RESPONSES_BASE, "text": {"verbosity": "low"}}),
    "TextFormat.type": (
        {**RESPONSES_BASE, "text": {"format": {"type": "text"}}},
        {**RESPONSES_BASE, "text": {"format": {"type": "json_object"}}},
    ),
    "TextFormat.schema": (
        {**RESPONSES_BASE, "text": {"format": {"type": "json_schema", "name": "a"}}},
        {**RESPONSES_BASE, "text": {"format": {"type": "json_schema", "name": "a", "schema": SCHEMA}}},
    ),
    "TextFormat.description": (
        RESPONSES_BASE,
        {**RESPONSES_BASE, "text": {"format": {"type": "json_schema", "name": "a", "description": "d"}}},
    ),
    "Reasoning.effort": (RESPONSES_BASE, {**RESPONSES_BASE, "reasoning": {"effort": "high"}}),
    "Reasoning.summary": (RESPONSES_BASE, {**RESPONSES_BASE, "reasoning": {"summary": "auto"}}),
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
    fields = (
        struct_fields(ChatCompletionRequest)
        | struct_fields(CompletionRequest)
        | struct_fields(ResponsesRequest)
    )
    assert fields == set(VARIANTS) | NO_EFFECT_BY_DESIGN
    assert set(FIELDS) == fields  # the compatibility table documents each, and nothing else


def test_the_compatibility_document_is_the_table() -> None:
    assert (Path(__file__).parents[2] / "docs" / "openai.md").read_text() == render_markdown()


@pytest.mark.parametrize("field", sorted(VARIANTS))
def test_every_field_changes_the_output_or_is_refused(
    served: Served, tok: ModelTokenizer, field: str
) -> None:
    base, variant = VARIANTS[field]
    # A special token mid-text, so skip_special_tokens shows; stop ids from the script's own text.
    ids = tok.encode(SCRIPT_TEXT, add_special_tokens=False)
    served.script("walk", FakeScript(token_ids=(*ids[:2], 1, *ids[2:])))
    struct = field.split(".")[0]
    endpoint = (
        "/v1/chat/completions"
        if struct in CHAT_STRUCTS
        else "/v1/responses"
        if struct in RESPONSES_STRUCTS
        else "/v1/completions"
    )
    # The header picks the script; prompt_cache_key is a route key too, which the header beats.
    headers = {} if field.endswith(".prompt_cache_key") else {"x-route-key": "walk"}
    with httpx.Client(base_url=served.url, timeout=20, headers=headers) as http:
        before, base_reply = outcome(http, served, endpoint, base)
        assert base_reply[0] == 200, base_reply
        if field.endswith(".previous_response_id"):  # continue the base's own (stored) response
            variant = {**variant, "previous_response_id": http.post(endpoint, json=base).json()["id"]}
        after, reply = outcome(http, served, endpoint, variant)
    support = FIELDS[field].support
    if reply[0] in (400, 404):
        struct, name = field.split(".")
        param = json.loads(reply[1])["error"]["param"]
        assert param == name or param.startswith(NESTED_IN.get(struct, "\0")), (field, param)
        assert support in ("no", "partly"), f"{field} is documented as {support!r} but was refused"
        return
    assert reply[0] == 200, reply
    assert (after, reply) != (before, base_reply), f"{field} was accepted and changed nothing"
    assert support in ("yes", "partly"), f"{field} is documented as {support!r} but changed the output"


RESPONSES_STRUCTS = {"ResponsesRequest", "TextConfig", "TextFormat", "Reasoning"}
CHAT_STRUCTS = {
    "ChatCompletionRequest",
    "ChatMessage",
    "ContentPart",
    "StreamOptions",
    "MessageToolCall",
    "ToolCallFunction",
    "ResponseFormat",
    "JsonSchemaFormat",
}
NESTED_IN = {
    "ChatMessage": "messages",
    "ContentPart": "messages",
    "StreamOptions": "stream_options",
    "MessageToolCall": "messages",
    "ToolCallFunction": "messages",
    "ResponseFormat": "response_format",
    "JsonSchemaFormat": "response_format",
    "TextConfig": "text",
    "TextFormat": "text",
    "Reasoning": "reasoning",
}


def outcome(
    http: httpx.Client, served: Served, endpoint: str, body: dict[str, Any]
) -> tuple[object, tuple[int, str]]:
    """What the backend received (without the request id) and what the client read (without
    ids and timestamps)."""
    count = len(served.backend.requests)
    r = http.post(endpoint, json=body)
    check_conformance(endpoint, r)
    received = None
    if len(served.backend.requests) > count:  # with the routing hints that reached it
        request = msgspec.structs.replace(served.backend.requests[-1], request_id="")
        received = (request, served.backend.contexts[-1].route_key)
    text = re.sub(r'"(id|created|created_at|item_id|call_id)":("[^"]*"|\d+)', "", r.text)
    return received, (r.status_code, text)


_BODY_SCHEMA = {
    "/v1/chat/completions": (CHAT_COMPLETION, CHAT_COMPLETION_CHUNK),
    "/v1/completions": (COMPLETION, COMPLETION),
    "/v1/responses": (RESPONSE, RESPONSE_EVENT),
}


def check_conformance(endpoint: str, r: httpx.Response) -> None:
    """Every body and stream chunk has the fields, and the nullability, OpenAI's specification
    gives it (``response_schemas``); an error is always the error object."""
    if r.status_code != 200:
        jsonschema.validate(r.json(), ERROR)
        return
    whole, chunk = _BODY_SCHEMA[endpoint]
    if not r.headers["content-type"].startswith("text/event-stream"):
        jsonschema.validate(r.json(), whole)
        return
    events = [line[len("data: ") :] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events and events[-1] == "[DONE]"
    for event in events[:-1]:
        data = json.loads(event)
        jsonschema.validate(data, ERROR if "error" in data else chunk)
