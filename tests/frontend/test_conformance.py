"""What OpenAI's specification and vLLM's extensions ask of every response: error objects on
every path and method, ``x-request-id`` everywhere, required nullable fields, vLLM's
``/tokenize``, ``/detokenize`` and ``/version``, and the vLLM output options."""

from __future__ import annotations

import json
import logging

import httpx
import openai
import pytest

from interlock.frontend.tokenizer import ModelTokenizer
from tests.e2e.conftest import wait_until
from tests.frontend.conftest import MODEL, Served
from tests.frontend.test_app import USER, client, http, scripted

__all__ = ["client", "http"]  # the module fixtures of test_app, shared


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/nope", 404),
        ("POST", "/v1/nope", 404),
        ("GET", "/v1/chat/completions", 405),
        ("PUT", "/v1/models", 405),
    ],
)
def test_unknown_paths_and_methods_answer_error_objects(
    http: httpx.Client, method: str, path: str, status: int
) -> None:
    r = http.request(method, path, headers={"x-request-id": "client-7"})
    assert r.status_code == status
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and path in error["message"]
    assert r.headers["x-request-id"] == "client-7"
    if status == 405:
        assert "POST" in r.headers["Allow"] or "GET" in r.headers["Allow"]


def test_every_response_carries_a_request_id(http: httpx.Client) -> None:
    for r in (http.get("/v1/models"), http.get("/health"), http.post("/v1/completions", content=b"{")):
        assert r.headers.get("x-request-id"), r.url


def test_chat_message_and_logprobs_carry_refusal_null(
    http: httpx.Client, served: Served, tok: ModelTokenizer
) -> None:
    headers = scripted(served, tok, "Hi there")
    body = {"model": MODEL, "messages": USER, "logprobs": True, "max_tokens": 4}
    choice = http.post("/v1/chat/completions", json=body, headers=headers).json()["choices"][0]
    assert "refusal" in choice["message"] and choice["message"]["refusal"] is None
    assert "refusal" in choice["logprobs"] and choice["logprobs"]["refusal"] is None


def test_tokenize_detokenize_and_version(http: httpx.Client, tok: ModelTokenizer) -> None:
    r = http.post("/tokenize", json={"model": MODEL, "prompt": "Hello world"}).json()
    assert r["tokens"] == tok.encode("Hello world", add_special_tokens=True) and r["count"] == len(
        r["tokens"]
    )
    assert r["max_model_len"] > 0 and r["token_strs"] is None
    chat = http.post("/tokenize", json={"model": MODEL, "messages": USER, "return_token_strs": True}).json()
    assert chat["count"] > r["count"] and len(chat["token_strs"]) == chat["count"]
    back = http.post("/detokenize", json={"model": MODEL, "tokens": r["tokens"]}).json()
    assert back["prompt"].endswith("Hello world")
    assert http.get("/version").json()["version"]
    for path, body, param in (
        ("/tokenize", {"model": MODEL}, "prompt"),
        ("/tokenize", {"model": MODEL, "prompt": "x", "extra": 1}, "extra"),
        ("/detokenize", {"model": MODEL, "tokens": [10**9]}, "tokens"),
        ("/detokenize", {"model": "nope", "tokens": [1]}, "model"),
    ):
        bad = http.post(path, json=body)
        assert bad.status_code in (400, 404) and bad.json()["error"]["param"] == param, (path, bad.text)


def test_include_stop_str_and_token_ids_as_text(
    client: openai.OpenAI, served: Served, tok: ModelTokenizer
) -> None:
    headers = scripted(served, tok, "a, b, c. d")
    r = client.completions.create(
        model=MODEL,
        prompt="x",
        stop=".",
        extra_headers=headers,
        extra_body={"include_stop_str_in_output": True},
    )
    assert (r.choices[0].text, r.choices[0].finish_reason) == ("a, b, c.", "stop")
    r = client.completions.create(
        model=MODEL,
        prompt="x",
        logprobs=1,
        extra_headers=headers,
        extra_body={"return_tokens_as_token_ids": True},
    )
    assert r.choices[0].logprobs is not None and r.choices[0].logprobs.tokens
    assert all(t.startswith("token_id:") for t in r.choices[0].logprobs.tokens)


def test_echo_and_continuous_usage(client: openai.OpenAI, served: Served, tok: ModelTokenizer) -> None:
    headers = scripted(served, tok, " the end")
    r = client.completions.create(model=MODEL, prompt="Once upon a time", echo=True, extra_headers=headers)
    assert r.choices[0].text == "Once upon a time the end"
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt="Once upon a time",
            echo=True,
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},  # type: ignore[typeddict-unknown-key]
            extra_headers=headers,
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "Once upon a time the end"
    counts = [c.usage.completion_tokens for c in chunks if c.choices and c.usage is not None]
    assert counts and counts == sorted(counts) and len(counts) == len([c for c in chunks if c.choices])


def test_prompt_cache_key_routes_and_the_access_log_names_the_user(
    http: httpx.Client, served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    body = {
        "model": MODEL,
        "prompt": "x",
        "max_tokens": 2,
        "prompt_cache_key": "conv-9",
        "safety_identifier": "u-3",
    }
    rid = ""

    def ours() -> list[str]:
        # a line of an earlier test's request may be flushed into this capture: find ours
        return [
            r.getMessage()
            for r in caplog.records
            if r.name == "interlock.access" and rid and r.getMessage().startswith(rid)
        ]

    with caplog.at_level(logging.INFO, logger="interlock.access"):
        resp = http.post("/v1/completions", json={**body, "metadata": {"team": "a"}})
        assert resp.status_code == 200
        rid = resp.json()["id"]
        # logged with the other lines of its moment, at most FLUSH_S later
        assert wait_until(lambda: bool(ours()), 5.0)
    assert served.backend.contexts[-1].route_key == "conv-9"
    line = ours()[0]
    assert "status=200" in line and "safety_identifier=u-3" in line and "'team': 'a'" in line


def test_neutral_sdk_defaults_reach_the_engine_as_nothing(http: httpx.Client, served: Served) -> None:
    body = {
        "model": MODEL,
        "messages": USER,
        "max_tokens": 4.0,
        "store": False,
        "metadata": {},
        "service_tier": "auto",
        "logit_bias": {},
        "top_p": 0,
        "repetition_penalty": 1.0,
    }
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    sampling = served.backend.requests[-1].sampling
    assert sampling.greedy and sampling.max_tokens == 4 and not sampling.penalized
    assert json.loads(r.text)["choices"][0]["message"]["refusal"] is None


def test_n_choices_share_one_session_and_count_the_prompt_once(
    client: openai.OpenAI, served: Served, tok: ModelTokenizer
) -> None:
    headers = scripted(served, tok, "a b c")
    before = len(served.backend.requests)
    r = client.chat.completions.create(model=MODEL, messages=USER, n=3, seed=5, extra_headers=headers)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert all(c.message.content == "a b c" for c in r.choices)
    sent = served.backend.requests[before:]
    contexts = served.backend.contexts[before:]
    assert len({s.request_id for s in sent}) == 3 and [s.sampling.seed for s in sent] == [5, 6, 7]
    assert len({c.session_id for c in contexts}) == 1 and contexts[0].session_id is not None
    assert r.usage is not None and r.usage.prompt_tokens == len(sent[0].token_ids)
    assert r.usage.completion_tokens == 3 * len(tok.encode("a b c", add_special_tokens=False))


def test_n_streams_every_choice_and_batches_index_prompt_by_prompt(
    client: openai.OpenAI, served: Served, tok: ModelTokenizer
) -> None:
    headers = scripted(served, tok, "x y")
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt=["one", "two"],
            n=2,
            stream=True,
            stream_options={"include_usage": True},
            extra_headers=headers,
        )
    )
    texts: dict[int, str] = {}
    finished = set()
    for c in chunks:
        for choice in c.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
            if choice.finish_reason:
                finished.add(choice.index)
    assert texts == {i: "x y" for i in range(4)} and finished == {0, 1, 2, 3}
    usage = chunks[-1].usage
    one, two = (len(tok.encode(p, add_special_tokens=True)) for p in ("one", "two"))
    assert usage is not None and usage.prompt_tokens == one + two
    r = client.completions.create(model=MODEL, prompt=["one", "two"], n=2, extra_headers=headers)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    sent = served.backend.requests[-4:]
    assert sorted(len(s.token_ids) for s in sent) == sorted([one, one, two, two])


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "a", "schema": {"type": "nonsense"}},
                }
            },
            "response_format",
        ),
        ({"structured_outputs": {"regex": "(unclosed"}}, "structured_outputs"),
        ({"structured_outputs": {"grammar": "root ::= ("}}, "structured_outputs"),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "parameters": {"type": "object", "properties": {"a": {"type": "nope"}}},
                        },
                    }
                ],
                "tool_choice": "required",
            },
            "tools",
        ),
    ],
)
def test_a_bad_constraint_is_a_400_before_any_work(
    http: httpx.Client, served: Served, extra: dict[str, object], param: str
) -> None:
    sent = len(served.backend.requests)
    r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": USER, **extra})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert len(served.backend.requests) == sent  # nothing reached a worker


def test_a_good_constraint_reaches_the_engine(http: httpx.Client, served: Served) -> None:
    schema = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"]}
    body = {"model": MODEL, "messages": USER, "max_tokens": 4}
    fmt = {"type": "json_schema", "json_schema": {"name": "c", "schema": schema, "strict": True}}
    assert http.post("/v1/chat/completions", json={**body, "response_format": fmt}).status_code == 200
    structured = served.backend.requests[-1].sampling.structured
    assert (
        structured is not None
        and structured.kind == "json_schema"
        and json.loads(structured.spec) == {**schema, "additionalProperties": False}
    )


def test_omitted_sampling_fields_take_the_models_recommended_values(
    http: httpx.Client, served: Served
) -> None:
    assert (
        http.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2}).status_code == 200
    )
    sampling = served.backend.requests[-1].sampling
    assert (sampling.temperature, sampling.top_p) == (0.2, 0.9)  # SmolLM2's card
    body = {"model": MODEL, "prompt": "x", "max_tokens": 2, "temperature": 1, "top_p": 1}
    assert http.post("/v1/completions", json=body).status_code == 200
    sampling = served.backend.requests[-1].sampling
    assert (sampling.temperature, sampling.top_p) == (1.0, 1.0)  # what the client asks wins


def test_best_of_keeps_the_best_by_mean_logprob(
    client: openai.OpenAI, served: Served, tok: ModelTokenizer
) -> None:
    headers = scripted(served, tok, "a b c")
    before = len(served.backend.requests)
    r = client.completions.create(model=MODEL, prompt=["one", "two"], best_of=3, n=2, extra_headers=headers)
    sent = served.backend.requests[before:]
    assert len(sent) == 6 and all(s.sampling.logprobs == 0 for s in sent)  # scored on logprobs
    assert [c.index for c in r.choices] == [0, 1, 2, 3] and all(c.logprobs is None for c in r.choices)
    assert r.usage is not None and r.usage.completion_tokens == 6 * len(
        tok.encode("a b c", add_special_tokens=False)
    )
    r = client.completions.create(model=MODEL, prompt="one", best_of=2, logprobs=1, extra_headers=headers)
    assert len(r.choices) == 1 and r.choices[0].logprobs is not None


def test_prompt_logprobs_and_echo_with_logprobs(
    client: openai.OpenAI, served: Served, tok: ModelTokenizer
) -> None:
    headers = scripted(served, tok, " the end")
    prompt = "Once upon a time"
    ids = tok.encode(prompt, add_special_tokens=True)
    r = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=3, extra_headers=headers, extra_body={"prompt_logprobs": 1}
    )
    assert served.backend.requests[-1].sampling.prompt_logprobs == 1
    entries = r.choices[0].model_extra["prompt_logprobs"]  # type: ignore[index]
    assert len(entries) == len(ids) and entries[0] is None
    assert all(str(t) in e and e[str(t)]["logprob"] <= 0 for t, e in zip(ids[1:], entries[1:], strict=True))
    r = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=3, echo=True, logprobs=1, extra_headers=headers
    )
    assert served.backend.requests[-1].sampling.prompt_logprobs == 1  # echo with logprobs needs them
    lp = r.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None
    completion = tok.encode(" the end", add_special_tokens=False)
    assert len(lp.tokens) == len(ids) + len(completion) and lp.token_logprobs[0] is None
    assert "".join(lp.tokens) == r.choices[0].text  # the arrays cover the echoed prompt, then the completion
    chat = client.chat.completions.create(
        model=MODEL, messages=USER, max_tokens=3, extra_headers=headers, extra_body={"prompt_logprobs": 0}
    )
    assert chat.model_extra is not None and chat.model_extra["prompt_logprobs"][0] is None


def test_echo_of_a_batch_gives_each_prompt_as_sent(
    client: openai.OpenAI, served: Served, tok: ModelTokenizer
) -> None:
    headers = scripted(served, tok, " the end")
    r = client.completions.create(
        model=MODEL, prompt=["One day", "Two nights"], echo=True, extra_headers=headers
    )
    assert [c.text for c in r.choices] == ["One day the end", "Two nights the end"]
