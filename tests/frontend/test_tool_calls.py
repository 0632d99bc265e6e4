"""Tool calling through the HTTP frontend (fake engine): the tools reach the prompt, calls come
back as ``tool_calls`` (streamed as deltas), a forced call is constrained, the history renders."""

from __future__ import annotations

import json

import openai

from interlock.frontend.tokenizer import ModelTokenizer
from tests.frontend.conftest import MODEL, Served
from tests.frontend.test_app import USER, client, scripted

__all__ = ["client"]

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
REPLY = 'Let me look. <tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</tool_call>'


def test_a_call_comes_back_as_tool_calls(client: openai.OpenAI, served: Served, tok: ModelTokenizer) -> None:
    headers = scripted(served, tok, REPLY)
    r = client.chat.completions.create(model=MODEL, messages=USER, tools=[WEATHER], extra_headers=headers)  # type: ignore[list-item]
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me look."
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1 and calls[0].id.startswith("call_")
    assert calls[0].function.name == "get_weather" and json.loads(calls[0].function.arguments) == {
        "city": "Paris"
    }
    prompt = tok.decode(list(served.backend.requests[-1].token_ids), skip_special_tokens=False)
    assert "<tools>" in prompt and "get_weather" in prompt
    assert served.backend.requests[-1].sampling.structured is None  # "auto": a plain answer may do


def test_calls_stream_as_deltas_and_markup_never_leaks(
    client: openai.OpenAI, served: Served, tok: ModelTokenizer
) -> None:
    headers = scripted(served, tok, REPLY)
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=USER,
            tools=[WEATHER],
            stream=True,
            extra_headers=headers,  # type: ignore[list-item]
        )
    )
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert "<tool_call>" not in content and content.strip() == "Let me look."
    assert len(calls) == 1 and calls[0].function is not None and calls[0].function.name == "get_weather"
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_a_forced_call_is_constrained_by_its_schema(
    client: openai.OpenAI, served: Served, tok: ModelTokenizer
) -> None:
    headers = scripted(served, tok, '[{"name": "get_weather", "arguments": {"city": "Oslo"}}]')
    r = client.chat.completions.create(
        model=MODEL,
        messages=USER,
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        extra_headers=headers,
    )
    calls = r.choices[0].message.tool_calls
    assert calls is not None and json.loads(calls[0].function.arguments) == {"city": "Oslo"}
    assert r.choices[0].message.content is None
    sent = served.backend.requests[-1]
    assert sent.sampling.structured is not None and sent.sampling.structured.kind == "json_schema"
    schema = json.loads(sent.sampling.structured.spec)
    assert "get_weather" in json.dumps(schema) and "city" in json.dumps(schema)
    assert tok.decode(list(sent.token_ids), skip_special_tokens=False).endswith("<tool_call>")


def test_tool_results_go_back_into_the_prompt(
    client: openai.OpenAI, served: Served, tok: ModelTokenizer
) -> None:
    headers = scripted(served, tok, "It is sunny in Paris.")
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    messages = [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "sunny"}'},
    ]
    r = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], extra_headers=headers)  # type: ignore[arg-type, list-item]
    assert r.choices[0].message.content == "It is sunny in Paris." and r.choices[0].finish_reason == "stop"
    prompt = tok.decode(list(served.backend.requests[-1].token_ids), skip_special_tokens=False)
    assert '"sky": "sunny"' in prompt and '"city": "Paris"' in prompt and "<tool_response>" in prompt


def test_parallel_tool_calls_false_keeps_one_call(
    client: openai.OpenAI, served: Served, tok: ModelTokenizer
) -> None:
    two = '<tool_call>[{"name": "get_weather", "arguments": {"city": "A"}}, {"name": "get_weather", "arguments": {"city": "B"}}]</tool_call>'
    headers = scripted(served, tok, two)
    r = client.chat.completions.create(
        model=MODEL,
        messages=USER,
        tools=[WEATHER],
        parallel_tool_calls=False,
        extra_headers=headers,  # type: ignore[list-item]
    )
    calls = r.choices[0].message.tool_calls
    assert calls is not None and [json.loads(c.function.arguments)["city"] for c in calls] == ["A"]
    r = client.chat.completions.create(model=MODEL, messages=USER, tools=[WEATHER], extra_headers=headers)  # type: ignore[list-item]
    assert r.choices[0].message.tool_calls is not None and len(r.choices[0].message.tool_calls) == 2


def test_a_strict_tools_forced_call_closes_its_objects(
    client: openai.OpenAI, served: Served, tok: ModelTokenizer
) -> None:
    headers = scripted(served, tok, '[{"name": "get_weather", "arguments": {"city": "Oslo"}}]')
    strict = {"type": "function", "function": {**WEATHER["function"], "strict": True}}  # type: ignore[dict-item]
    for tool, closed in ((WEATHER, False), (strict, True)):
        client.chat.completions.create(
            model=MODEL,
            messages=USER,
            tools=[tool],
            tool_choice="required",
            extra_headers=headers,  # type: ignore[list-item]
        )
        structured = served.backend.requests[-1].sampling.structured
        assert structured is not None
        (arguments,) = list(_objects_with(json.loads(structured.spec), "city"))
        assert (arguments.get("additionalProperties") is False) is closed


def _objects_with(schema: object, name: str) -> list[dict[str, object]]:
    """The object schemas in ``schema`` that have a property ``name``."""
    found = []
    if isinstance(schema, dict):
        properties = schema.get("properties")
        if isinstance(properties, dict) and name in properties:
            found.append(schema)
        for value in schema.values():
            found += _objects_with(value, name)
    elif isinstance(schema, list):
        for value in schema:
            found += _objects_with(value, name)
    return found
