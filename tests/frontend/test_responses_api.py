"""The Responses API through the official client (fake engine): text, streaming events, tools,
structured text, stored conversations, and its errors."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from interlock.frontend.tokenizer import ModelTokenizer
from tests.frontend.conftest import MODEL, Served
from tests.frontend.test_app import client, http, scripted

__all__ = ["client", "http"]

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def test_create_returns_output_text_and_usage(
    client: openai.OpenAI, served: Served, tok: ModelTokenizer
) -> None:
    headers = scripted(served, tok, "Hello there")
    r = client.responses.create(
        model=MODEL, input="Hi", instructions="Be brief.", max_output_tokens=50, extra_headers=headers
    )
    assert r.id.startswith("resp_") and r.status == "completed" and r.output_text == "Hello there"
    assert r.usage is not None and r.usage.output_tokens == len(
        tok.encode("Hello there", add_special_tokens=False)
    )
    prompt = tok.decode(list(served.backend.requests[-1].token_ids), skip_special_tokens=False)
    assert "Be brief." in prompt and "Hi" in prompt
    assert served.backend.requests[-1].sampling.max_tokens == 50


def test_streaming_events_in_order(client: openai.OpenAI, served: Served, tok: ModelTokenizer) -> None:
    headers = scripted(served, tok, "Hello there")
    events = list(client.responses.create(model=MODEL, input="Hi", stream=True, extra_headers=headers))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "Hello there"
    done = events[-1]
    assert done.type == "response.completed" and done.response.output_text == "Hello there"
    assert done.response.usage is not None and done.response.usage.output_tokens > 0


def test_function_calls_and_their_outputs(client: openai.OpenAI, served: Served, tok: ModelTokenizer) -> None:
    reply = '<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</tool_call>'
    headers = scripted(served, tok, reply)
    r = client.responses.create(
        model=MODEL, input="Weather in Paris?", tools=[WEATHER], extra_headers=headers
    )  # type: ignore[list-item]
    calls = [item for item in r.output if item.type == "function_call"]
    assert (
        len(calls) == 1
        and calls[0].name == "get_weather"
        and json.loads(calls[0].arguments) == {"city": "Paris"}
    )
    events = list(
        client.responses.create(
            model=MODEL, input="Weather?", tools=[WEATHER], stream=True, extra_headers=headers
        )  # type: ignore[list-item]
    )
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and json.loads(done[0].arguments) == {"city": "Paris"}
    headers = scripted(served, tok, "It is sunny.")
    follow = client.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "type": "function_call",
                "call_id": calls[0].call_id,
                "name": "get_weather",
                "arguments": calls[0].arguments,
            },
            {"type": "function_call_output", "call_id": calls[0].call_id, "output": '{"sky": "sunny"}'},
        ],
        tools=[WEATHER],  # type: ignore[list-item]
        extra_headers=headers,
    )
    assert follow.output_text == "It is sunny."
    prompt = tok.decode(list(served.backend.requests[-1].token_ids), skip_special_tokens=False)
    assert '"sky": "sunny"' in prompt and "get_weather" in prompt


def test_previous_response_id_continues_a_stored_conversation(
    client: openai.OpenAI, http: httpx.Client, served: Served, tok: ModelTokenizer
) -> None:
    headers = scripted(served, tok, "I am Smol.")
    first = client.responses.create(model=MODEL, input="Who are you?", extra_headers=headers)
    second = client.responses.create(
        model=MODEL, input="And again?", previous_response_id=first.id, extra_headers=headers
    )
    prompt = tok.decode(list(served.backend.requests[-1].token_ids), skip_special_tokens=False)
    assert prompt.index("Who are you?") < prompt.index("I am Smol.") < prompt.index("And again?")
    assert http.get(f"/v1/responses/{second.id}").json()["output"][0]["content"][0]["text"] == "I am Smol."
    assert http.delete(f"/v1/responses/{second.id}").json()["deleted"] is True
    assert http.get(f"/v1/responses/{second.id}").status_code == 404
    unstored = client.responses.create(model=MODEL, input="x", store=False, extra_headers=headers)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, input="y", previous_response_id=unstored.id)


def test_structured_text_and_refusals_by_name(
    client: openai.OpenAI, served: Served, tok: ModelTokenizer
) -> None:
    headers = scripted(served, tok, '{"a": 1}')
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    client.responses.create(
        model=MODEL,
        input="x",
        text={"format": {"type": "json_schema", "name": "a", "schema": schema, "strict": True}},
        extra_headers=headers,
    )
    structured = served.backend.requests[-1].sampling.structured
    assert structured is not None and json.loads(structured.spec) == {**schema, "additionalProperties": False}
    for extra, param in (
        ({"truncation": "auto"}, "truncation"),
        ({"include": ["reasoning.encrypted_content"]}, "include"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"nope": 1}, "nope"),
    ):
        body = {"model": MODEL, "input": "x", **extra}
        with pytest.raises(openai.BadRequestError) as info:
            client.post("/responses", cast_to=object, body=body)
        assert isinstance(info.value.body, dict) and info.value.body["param"] == param, (
            extra,
            info.value.body,
        )
