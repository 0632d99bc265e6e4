"""End to end, what agent and RAG clients send, against ``interlock serve`` with the real SmolLM2
and the official client: JSON-schema outputs, a tool-calling round trip, ``n`` choices from one
prefill, each penalty doing what its definition says, and the Responses API."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from tests.e2e.conftest import Served, start_serve

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
SCHEMAS: dict[str, dict[str, Any]] = {
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 30},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "city": {"type": "string", "maxLength": 30},
        },
        "required": ["name", "age", "city"],
        "additionalProperties": False,
    },
    "book": {
        "type": "object",
        "properties": {
            "title": {"type": "string", "maxLength": 40},
            "author": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 30},
                    "born": {"type": "integer", "minimum": 1000, "maximum": 2025},
                },
                "required": ["name", "born"],
            },
        },
        "required": ["title", "author"],
    },
    "list": {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "items": {"type": "string", "maxLength": 20},
                "minItems": 1,
                "maxItems": 4,
            }
        },
        "required": ["items"],
    },
    "sentiment": {
        "type": "object",
        "properties": {
            "sentiment": {"enum": ["positive", "negative", "neutral"]},
            "score": {"type": "integer", "minimum": 1, "maximum": 5},
        },
        "required": ["sentiment", "score"],
    },
    "answer": {
        "type": "object",
        "properties": {"answer": {"type": "boolean"}, "reason": {"type": "string", "maxLength": 50}},
        "required": ["answer"],
    },
}
PROMPTS = [
    "Describe a person you admire.",
    "Tell me about a famous book.",
    "List a few fruits.",
    "How do you feel about rainy days?",
    "Is the sky blue?",
    "Invent a character for a story.",
    "What did you read last?",
    "Name some colours.",
    "Review a restaurant you like.",
    "Is water wet?",
    "Who is your favourite scientist?",
    "Recommend a novel.",
    "What should I pack for a trip?",
    "Was the movie good?",
    "Can birds fly?",
    "Describe your neighbour.",
    "Which classic should I read?",
    "Give me a shopping list.",
    "Rate your day.",
    "Is Paris in France?",
]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 30}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    # Two frontend processes on the port: each client's connections land on either (a stored
    # response is found by the other, /metrics sums both).
    served = start_serve("--workers", "1", "--frontend-workers", "2")
    try:
        yield served
    finally:
        served.stop()


@pytest.fixture(scope="module")
def client(served: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.base_url, api_key="none", max_retries=0, timeout=300)


def test_json_schema_outputs_validate(client: openai.OpenAI) -> None:
    def ask(case: tuple[str, str]) -> tuple[str, str, str | None, str | None]:
        name, prompt = case
        fmt = {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}}
        r = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": prompt}],
            response_format=fmt,  # type: ignore[arg-type]
            max_tokens=160,
            temperature=0.7,
            seed=len(prompt),
        )
        return name, prompt, r.choices[0].message.content, r.choices[0].finish_reason

    cases = [(name, prompt) for name in SCHEMAS for prompt in PROMPTS]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(ask, cases))
    for name, prompt, text, finish in results:
        assert finish == "stop", (name, prompt, text)
        jsonschema.validate(json.loads(text or ""), SCHEMAS[name])


def test_tool_calling_round_trip(client: openai.OpenAI) -> None:
    messages: list[Any] = [{"role": "user", "content": "What is the weather like in Paris today?"}]
    r = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        tools=[WEATHER],
        tool_choice="required",
        max_tokens=200,  # room for several calls: "required" lets the model make more than one
        temperature=0,  # type: ignore[list-item]
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, WEATHER["function"]["parameters"])  # type: ignore[index]
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=messages,
            tools=[WEATHER],
            tool_choice="required",
            max_tokens=200,
            temperature=0,  # greedy, as above: a sampled reply may run out of tokens mid-call
            stream=True,  # type: ignore[list-item]
        )
    )
    streamed = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert streamed and streamed[0].function is not None and streamed[0].function.name == "get_weather"
    assert isinstance(json.loads(streamed[0].function.arguments or "")["city"], str)
    assert "<tool_call>" not in "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {
            "role": "tool",
            "tool_call_id": call.id,
            "content": json.dumps({"city": args["city"], "sky": "sunny", "celsius": 21}),
        },
    ]
    final = client.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER], max_tokens=40, temperature=0
    )
    assert final.choices[0].message.content and not final.choices[0].message.tool_calls


def cached_tokens(served: Served) -> float:
    text = httpx.get(served.base_url.removesuffix("/v1") + "/metrics").text
    found = re.search(r'^interlock_prompt_tokens_cached_total\{model="[^"]+"\} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def test_n_choices_share_one_prefill(client: openai.OpenAI, served: Served) -> None:
    prompt = "Write a short poem about the sea. " * 12  # several KV blocks
    before = cached_tokens(served)
    r = client.completions.create(model=MODEL, prompt=prompt, n=4, max_tokens=12, seed=3)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert len({c.text for c in r.choices}) > 1  # four draws, not one copied
    assert r.usage is not None
    # The three copies found the prompt in the first one's prefix cache (whole blocks of it).
    assert cached_tokens(served) - before >= 3 * (r.usage.prompt_tokens - 16)


def greedy(client: openai.OpenAI, prompt: str, **extra: Any) -> list[int]:
    r = client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=40,
        temperature=0,
        logprobs=0,
        extra_body={"return_tokens_as_token_ids": True, **extra},
    )
    assert r.choices[0].logprobs is not None and r.choices[0].logprobs.tokens
    return [int(t.removeprefix("token_id:")) for t in r.choices[0].logprobs.tokens]


def test_each_penalty_does_what_it_says(client: openai.OpenAI, served: Served) -> None:
    prompt = "one two one two one two one two one two"
    base = greedy(client, prompt)
    top = Counter(base).most_common(1)[0][1]
    # frequency: every repeat costs more, so no token repeats as often as the most repeated one
    assert Counter(greedy(client, prompt, frequency_penalty=2.0)).most_common(1)[0][1] < top
    # presence: a token already used costs 2, so more distinct tokens appear
    assert len(set(greedy(client, prompt, presence_penalty=2.0))) > len(set(base))
    # repetition: tokens of the prompt and output lose, so fewer of the prompt's tokens come back
    url = served.base_url.removesuffix("/v1") + "/tokenize"
    prompt_ids = set(httpx.post(url, json={"model": MODEL, "prompt": prompt}).json()["tokens"])
    in_prompt = sum(t in prompt_ids for t in greedy(client, prompt, repetition_penalty=1.8))
    assert in_prompt < sum(t in prompt_ids for t in base)
    # logit_bias: -100 bans a token, +100 forces one
    banned = Counter(base).most_common(1)[0][0]
    assert banned not in greedy(client, prompt, logit_bias={str(banned): -100})
    assert set(greedy(client, prompt, logit_bias={"30": 100})) == {30}


def test_responses_round_trip(client: openai.OpenAI) -> None:
    r = client.responses.create(
        model=MODEL, input="What is the capital of France?", max_output_tokens=20, temperature=0
    )
    assert r.status in ("completed", "incomplete") and r.output_text and r.usage is not None
    follow = client.responses.create(
        model=MODEL, input="And of Italy?", previous_response_id=r.id, max_output_tokens=20
    )
    assert follow.output_text
    events = list(client.responses.create(model=MODEL, input="Say hello.", max_output_tokens=12, stream=True))
    assert events[0].type == "response.created" and events[-1].type in (
        "response.completed",
        "response.incomplete",
    )
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text and text == events[-1].response.output_text  # type: ignore[union-attr]
    call = client.responses.create(
        model=MODEL,
        input="What is the weather in Oslo?",
        tools=[{"type": "function", **WEATHER["function"]}],  # type: ignore[list-item, dict-item]
        tool_choice="required",
        max_output_tokens=200,
        temperature=0,
    )
    calls = [item for item in call.output if item.type == "function_call"]
    assert calls and json.loads(calls[0].arguments)["city"]


def test_a_stored_response_is_found_by_either_frontend_process(client: openai.OpenAI, served: Served) -> None:
    r = client.responses.create(model=MODEL, input="Name a colour.", max_output_tokens=8, temperature=0)
    for _ in range(6):  # each on a connection of its own: the kernel picks the process
        got = httpx.get(f"{served.base_url}/responses/{r.id}", timeout=30)
        assert got.status_code == 200 and got.json()["id"] == r.id, got.text
        follow = httpx.post(
            f"{served.base_url}/responses",
            json={"model": MODEL, "input": "Another.", "previous_response_id": r.id, "max_output_tokens": 4},
            timeout=60,
        )
        assert follow.status_code == 200, follow.text
