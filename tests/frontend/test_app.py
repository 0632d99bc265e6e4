"""The HTTP app end to end: the official openai client against a FakeBackend + real tokenizer."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable

import httpx
import msgspec
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from prometheus_client.parser import text_string_to_metric_families

from interlock.errors import EngineError, NoWorkers, Overloaded, TransportError
from interlock.frontend import FakeScript
from interlock.frontend.responses import client_message
from interlock.frontend.tokenizer import ModelTokenizer
from tests.frontend.conftest import MODEL, SMALL_CONTEXT, SMALL_MODEL, Served

USER: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def client(served: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0, timeout=20)


@pytest.fixture(scope="module")
def http(served: Served) -> httpx.Client:
    return httpx.Client(base_url=served.url, timeout=20)


def key() -> str:
    return uuid.uuid4().hex


def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return False


def scripted(served: Served, tok: ModelTokenizer, text: str, **fields: object) -> dict[str, str]:
    ids = tuple(tok.encode(text, add_special_tokens=False))
    return served.script(key(), FakeScript(token_ids=ids, **fields))  # type: ignore[arg-type]


# ---- happy paths ----
def test_chat_non_streaming_text_usage_and_cached_tokens(
    client: openai.OpenAI, served: Served, tok: ModelTokenizer
) -> None:
    headers = scripted(served, tok, "Héllo, wörld 😀!", cached_tokens=3)
    r = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=50, extra_headers=headers)
    choice = r.choices[0]
    assert r.object == "chat.completion" and r.model == MODEL and r.id.startswith("chatcmpl-")
    assert choice.message.role == "assistant" and choice.message.content == "Héllo, wörld 😀!"
    assert choice.finish_reason == "stop"  # the script ended before max_tokens, as at EOS
    prompt_len = len(served.backend.requests[-1].token_ids)
    n = len(tok.encode("Héllo, wörld 😀!", add_special_tokens=False))
    assert r.usage is not None
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (
        prompt_len,
        n,
        prompt_len + n,
    )
    assert r.usage.prompt_tokens_details is not None and r.usage.prompt_tokens_details.cached_tokens == 3


def test_chat_streaming_role_first_then_deltas_then_usage(
    client: openai.OpenAI, served: Served, tok: ModelTokenizer
) -> None:
    headers = scripted(served, tok, "one two three four five")
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=USER,
            max_tokens=3,
            stream=True,
            stream_options={"include_usage": True},
            extra_headers=headers,
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == tok.decode(tok.encode("one two three four five", add_special_tokens=False)[:3])
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 3


def test_streaming_without_include_usage_has_no_usage_chunk(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(model=MODEL, messages=USER, max_tokens=4, stream=True))
    assert all(c.choices and c.usage is None for c in chunks)


def test_completions_streaming_and_not(client: openai.OpenAI, served: Served, tok: ModelTokenizer) -> None:
    headers = scripted(served, tok, " the end")
    r = client.completions.create(model=MODEL, prompt="Once upon a time", extra_headers=headers)
    assert r.object == "text_completion" and r.choices[0].text == " the end"
    assert r.usage is not None and r.usage.prompt_tokens == len(
        tok.encode("Once upon a time", add_special_tokens=True)
    )
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt=[1, 2, 3],
            stream=True,
            stream_options={"include_usage": True},
            extra_headers=headers,
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == " the end"
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == 3
    assert served.backend.requests[-1].token_ids == (1, 2, 3)


def test_completions_default_max_tokens_is_16(client: openai.OpenAI, served: Served) -> None:
    r = client.completions.create(model=MODEL, prompt="x")
    assert r.usage is not None and r.usage.completion_tokens == 16
    assert r.choices[0].finish_reason == "length"


# ---- stop strings ----
@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_split_across_tokens(
    client: openai.OpenAI, served: Served, tok: ModelTokenizer, stream: bool
) -> None:
    text = "Hello world, and more"
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids[:1]) == "Hello"  # so "o wor" spans the first two tokens
    headers = scripted(served, tok, text)
    kwargs = {
        "model": MODEL,
        "messages": USER,
        "max_tokens": 30,
        "stop": ["o wor", "zzz"],
        "extra_headers": headers,
    }
    if stream:
        chunks = list(client.chat.completions.create(stream=True, **kwargs))  # type: ignore[call-overload]
        content = "".join(c.choices[0].delta.content or "" for c in chunks)
        finish = chunks[-1].choices[0].finish_reason
    else:
        r = client.chat.completions.create(**kwargs)  # type: ignore[call-overload]
        content, finish = r.choices[0].message.content, r.choices[0].finish_reason
    assert (content, finish) == ("Hell", "stop")
    # The frontend ended the generation early: the backend saw the stream closed (abort).
    request_id = served.backend.requests[-1].request_id
    assert wait_for(lambda: request_id in served.backend.aborted)


def test_stop_string_in_completions(client: openai.OpenAI, served: Served, tok: ModelTokenizer) -> None:
    headers = scripted(served, tok, "a, b, c. d")
    r = client.completions.create(model=MODEL, prompt="x", stop=".", extra_headers=headers)
    assert (r.choices[0].text, r.choices[0].finish_reason) == ("a, b, c", "stop")


# ---- logprobs, seed, sampling ----
def test_chat_logprobs_shape(client: openai.OpenAI, served: Served, tok: ModelTokenizer) -> None:
    headers = scripted(served, tok, "Hi there")
    r = client.chat.completions.create(
        model=MODEL, messages=USER, logprobs=True, top_logprobs=2, extra_headers=headers
    )
    entries = r.choices[0].logprobs.content  # type: ignore[union-attr]
    assert entries is not None and "".join(e.token for e in entries) == "Hi there"
    first = entries[0]
    assert first.logprob == -0.25 and bytes(first.bytes or []) == first.token.encode()
    assert len(first.top_logprobs) == 2 and first.top_logprobs[0].token == first.token
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=USER, logprobs=True, stream=True, extra_headers=headers
        )
    )
    streamed = [
        e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content or []
    ]
    assert [e.token for e in streamed] == [e.token for e in entries]
    assert all(e.top_logprobs == [] for e in streamed)


def test_completions_logprobs_shape(client: openai.OpenAI, served: Served, tok: ModelTokenizer) -> None:
    headers = scripted(served, tok, "Hi there")
    r = client.completions.create(model=MODEL, prompt="x", logprobs=1, extra_headers=headers)
    lp = r.choices[0].logprobs
    assert lp is not None and lp.tokens == ["Hi", " there"]
    assert lp.token_logprobs == [-0.25, -0.25] and lp.text_offset == [0, 2]
    assert lp.top_logprobs == [{"Hi": -0.25}, {" there": -0.25}]
    chunks = list(
        client.completions.create(model=MODEL, prompt="x", logprobs=0, stream=True, extra_headers=headers)
    )
    streamed = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs]
    assert [t for s in streamed for t in s.tokens or []] == ["Hi", " there"]
    assert [o for s in streamed for o in s.text_offset or []] == [0, 2]


def test_sampling_and_seed_reach_the_backend(client: openai.OpenAI, served: Served) -> None:
    kwargs = {
        "model": MODEL,
        "messages": USER,
        "max_tokens": 8,
        "seed": 1234,
        "temperature": 0.7,
        "top_p": 0.9,
    }
    extra = {"top_k": 5, "min_p": 0.05, "ignore_eos": True}
    a = client.chat.completions.create(extra_body=extra, **kwargs)  # type: ignore[call-overload]
    sampling = served.backend.requests[-1].sampling
    assert (sampling.seed, sampling.temperature, sampling.top_p, sampling.top_k, sampling.min_p) == (
        1234,
        0.7,
        0.9,
        5,
        0.05,
    )
    assert sampling.ignore_eos and sampling.max_tokens == 8 and sampling.stop_token_ids == ()
    b = client.chat.completions.create(extra_body=extra, **kwargs)  # type: ignore[call-overload]
    assert a.choices[0].message.content == b.choices[0].message.content  # same seed, same output


def test_two_models_side_by_side(client: openai.OpenAI, served: Served) -> None:
    listed = {m.id: m for m in client.models.list().data}
    assert set(listed) == {MODEL, SMALL_MODEL}
    assert client.models.retrieve(SMALL_MODEL).id == SMALL_MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")
    for name in (MODEL, SMALL_MODEL):
        r = client.chat.completions.create(
            model=name, messages=[{"role": "system", "content": "s"}, *USER], max_tokens=2
        )
        assert r.model == name and served.backend.requests[-1].model == name
    r = client.chat.completions.create(model=SMALL_MODEL, messages=USER)  # no max_tokens: clamped to fit
    prompt = len(served.backend.requests[-1].token_ids)
    assert served.backend.requests[-1].sampling.max_tokens == SMALL_CONTEXT - prompt


def test_routing_headers_and_response_headers(http: httpx.Client, served: Served) -> None:
    served.script("explained", FakeScript(response_headers=(("x-interlock-route", "worker-1"),)))
    r = http.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": USER, "max_tokens": 2, "priority": 3},
        headers={
            "x-route-key": "explained",
            "x-session-id": "s1",
            "x-interlock-explain": "1",
            "x-request-id": "my-id",
        },
    )
    assert r.status_code == 200 and r.headers["x-interlock-route"] == "worker-1"
    # The client's id is echoed; the server keeps its own (the body's id) for everything inside.
    assert r.headers["x-request-id"] == "my-id" and r.json()["id"].startswith("chatcmpl-")
    assert served.backend.requests[-1].request_id == r.json()["id"]
    ctx = served.backend.contexts[-1]
    assert (ctx.session_id, ctx.route_key, ctx.explain, ctx.endpoint) == ("s1", "explained", True, "chat")
    assert served.backend.requests[-1].priority == 3 and ctx.priority == 3
    http.post(
        "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 1}, headers={"x-priority": "-2"}
    )
    assert served.backend.requests[-1].priority == served.backend.contexts[-1].priority == -2


# ---- errors ----
def error_of(r: httpx.Response, status: int) -> dict[str, object]:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error  # type: ignore[no-any-return]


def test_malformed_json_and_wrong_types_are_400(http: httpx.Client) -> None:
    r = http.post(
        "/v1/chat/completions",
        content=b'{"model": "smol", "messages": [',
        headers={"content-type": "application/json"},
    )
    assert "malformed JSON" in str(error_of(r, 400)["message"])
    r = http.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": "many"})
    assert error_of(r, 400)["param"] == "max_tokens"
    r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": USER, "n": 65})
    assert error_of(r, 400)["param"] == "n"
    r = http.post(
        "/v1/chat/completions", json={"model": MODEL, "messages": USER}, headers={"x-priority": "high"}
    )
    assert error_of(r, 400)["type"] == "invalid_request_error"


def test_integer_fields_reach_the_backend_encodable_or_are_400(http: httpx.Client, served: Served) -> None:
    # Regression (schemathesis): a 120-bit top_k was a 500 when the dispatcher msgpack-encoded it.
    body = {"model": MODEL, "prompt": "x", "max_tokens": 2}
    for fields, param in (
        ({"top_k": 674562167275116616141822124563103744}, "top_k"),
        ({"stop_token_ids": [2**64]}, "stop_token_ids[0]"),
    ):
        r = http.post("/v1/completions", json={**body, **fields})
        assert error_of(r, 400)["param"] == param
    largest = {
        "top_k": 2**31 - 1,
        "stop_token_ids": [2**31 - 1],
        "seed": 2**64 - 1,
        "min_tokens": 2**63,
        "priority": -(2**31),
    }
    r = http.post("/v1/completions", json={"model": MODEL, "prompt": "x", **largest})  # min_tokens: clamped
    assert r.status_code == 200, r.text
    msgspec.msgpack.encode(served.backend.requests[-1])


def test_body_too_large_is_413(http: httpx.Client) -> None:
    r = http.post(
        "/v1/completions", content=b"x" * (33 * 1024 * 1024), headers={"content-type": "application/json"}
    )
    assert error_of(r, 413)["type"] == "invalid_request_error"


def test_unknown_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="nope", messages=USER)
    assert info.value.body["code"] == "model_not_found"  # type: ignore[index]


def test_prompt_over_context_is_400_with_the_limit(client: openai.OpenAI, http: httpx.Client) -> None:
    long_text = "word " * (SMALL_CONTEXT * 2)
    with pytest.raises(openai.BadRequestError, match=f"maximum context length is {SMALL_CONTEXT} tokens"):
        client.chat.completions.create(model=SMALL_MODEL, messages=[{"role": "user", "content": long_text}])
    r = http.post("/v1/completions", json={"model": SMALL_MODEL, "prompt": "hi", "max_tokens": SMALL_CONTEXT})
    assert error_of(r, 400)["code"] == "context_length_exceeded"


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (NoWorkers("no worker serves this model", retry_after=2.5), 503),
        (Overloaded("all workers are busy"), 503),
        (EngineError("kaboom"), 500),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_backend_errors_before_first_token(
    http: httpx.Client, served: Served, error: Exception, status: int, stream: bool
) -> None:
    headers = served.script(key(), FakeScript(error=error))  # type: ignore[arg-type]
    r = http.post(
        "/v1/chat/completions", json={"model": MODEL, "messages": USER, "stream": stream}, headers=headers
    )
    body = error_of(r, status)
    assert body["message"] == client_message(error)  # type: ignore[arg-type]
    assert str(error) not in str(body["message"])  # the internal message stays in the log
    if status == 503:
        assert r.headers["retry-after"] == ("3" if isinstance(error, NoWorkers) else "1")


def test_error_after_streaming_started_is_an_sse_event(
    client: openai.OpenAI, http: httpx.Client, served: Served
) -> None:
    headers = served.script(key(), FakeScript(error=EngineError("died mid-way"), error_after=2))
    with http.stream(
        "POST", "/v1/completions", json={"model": MODEL, "prompt": "x", "stream": True}, headers=headers
    ) as r:
        assert r.status_code == 200
        events = [line for line in r.iter_lines() if line]
    engine_failed = "the engine failed while running the request"
    assert json.loads(events[-2].removeprefix("data: "))["error"]["message"] == engine_failed
    assert events[-1] == "data: [DONE]"
    with pytest.raises(openai.APIError, match=engine_failed):
        list(client.completions.create(model=MODEL, prompt="x", stream=True, extra_headers=headers))
    r2 = http.post("/v1/completions", json={"model": MODEL, "prompt": "x"}, headers=headers)
    assert error_of(r2, 500)["message"] == engine_failed


@pytest.mark.parametrize("error_after", [0, 2])
def test_internal_addresses_never_reach_the_client(
    http: httpx.Client, served: Served, caplog: pytest.LogCaptureFixture, error_after: int
) -> None:
    secret = "connection to 127.0.0.1:37083 lost"
    headers = served.script(key(), FakeScript(error=TransportError(secret), error_after=error_after))
    with caplog.at_level(logging.WARNING, logger="interlock.frontend"):
        r = http.post("/v1/completions", json={"model": MODEL, "prompt": "x"}, headers=headers)
        with http.stream(
            "POST", "/v1/completions", json={"model": MODEL, "prompt": "x", "stream": True}, headers=headers
        ) as streamed:
            text = streamed.read().decode()
    assert error_of(r, 502)["type"] == "transport_error"
    assert "127.0.0.1" not in r.text and "37083" not in r.text
    assert "transport_error" in text and "127.0.0.1" not in text and "37083" not in text
    assert secret in caplog.text  # kept for the operator


def test_unexpected_backend_exception_is_a_500_or_an_sse_error(http: httpx.Client, served: Served) -> None:
    headers = served.script(key(), FakeScript(error=RuntimeError("bug"), error_after=2))
    r = http.post("/v1/completions", json={"model": MODEL, "prompt": "x"}, headers=headers)
    assert error_of(r, 500)["message"] == "internal server error"
    with http.stream(
        "POST", "/v1/completions", json={"model": MODEL, "prompt": "x", "stream": True}, headers=headers
    ) as r:
        events = [line for line in r.iter_lines() if line]
    assert json.loads(events[-2].removeprefix("data: "))["error"]["type"] == "internal_error"
    assert events[-1] == "data: [DONE]"


def test_errors_do_not_affect_other_requests(client: openai.OpenAI, served: Served) -> None:
    slow = served.script(key(), FakeScript(token_ids=tuple(range(300, 340)), token_delay_s=0.01))
    failing = served.script(key(), FakeScript(error=EngineError("boom")))
    results: list[str] = []

    def long_request() -> None:
        r = client.completions.create(model=MODEL, prompt="x", max_tokens=40, extra_headers=slow)
        results.append(r.choices[0].finish_reason)

    thread = threading.Thread(target=long_request)
    thread.start()
    for _ in range(5):
        with pytest.raises(openai.InternalServerError):
            client.completions.create(model=MODEL, prompt="x", extra_headers=failing)
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model="nope", prompt="x")
    thread.join(20)
    assert results == ["length"]


def server_id(served: Served, route_key: str) -> str | None:
    """The server's id of the request sent with ``route_key`` (None until the backend has it)."""
    return next((c.request_id for c in served.backend.contexts if c.route_key == route_key), None)


def test_client_disconnect_mid_stream_aborts(http: httpx.Client, served: Served) -> None:
    route_key = key()
    headers = served.script(route_key, FakeScript(token_delay_s=0.02))
    body = {"model": MODEL, "messages": USER, "max_tokens": 1000, "stream": True}
    with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
    assert wait_for(lambda: server_id(served, route_key) in served.backend.aborted)


def test_client_disconnect_while_waiting_non_streaming_aborts(served: Served) -> None:
    request_id = key()
    served.script(request_id, FakeScript(token_delay_s=0.02))
    body = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 1000}).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nx-route-key: {request_id}\r\n\r\n"
    )
    with socket.create_connection((served.server.host, served.server.port), timeout=10) as sock:
        sock.sendall(head.encode() + body)
        assert wait_for(lambda: server_id(served, request_id) is not None)
    assert wait_for(lambda: server_id(served, request_id) in served.backend.aborted)


# ---- operational endpoints ----
def test_health_live_and_no_models(http: httpx.Client, served: Served) -> None:
    assert http.get("/live").status_code == 200
    r = http.get("/health")
    assert r.status_code == 200 and set(r.json()["models"]) == {MODEL, SMALL_MODEL}
    entries, served.backend.entries = served.backend.entries, []
    try:
        r = http.get("/health")
        assert r.status_code == 503 and "retry-after" in r.headers
        assert http.get("/v1/models").json()["data"] == []
        assert error_of(http.post("/v1/completions", json={"model": MODEL, "prompt": "x"}), 404)
    finally:
        served.backend.entries = entries


def test_metrics_parse_as_prometheus_text(http: httpx.Client, client: openai.OpenAI) -> None:
    client.completions.create(model=MODEL, prompt="x", max_tokens=4)
    r = http.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    requests = {
        (s.labels["endpoint"], s.labels["status"]): s.value
        for s in families["interlock_http_requests"].samples
    }
    assert requests[("completions", "200")] >= 1 and requests[("chat", "404")] >= 1
    assert families["interlock_requests_in_flight"].samples[0].value >= 0
    ttft = {
        s.name: s.value
        for s in families["interlock_time_to_first_token_seconds"].samples
        if s.labels["model"] == MODEL
    }
    assert ttft["interlock_time_to_first_token_seconds_count"] >= 1
    for name in ("interlock_inter_token_latency_seconds", "interlock_request_duration_seconds"):
        assert families[name].type == "histogram"
    completion = {s.labels["model"]: s.value for s in families["interlock_completion_tokens"].samples}
    assert completion[MODEL] >= 4
    assert "interlock_prompt_tokens_cached" in families and "interlock_prompt_tokens" in families


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        (
            {"tools": [{"type": "function", "function": {"name": "f g", "parameters": {}}}]},
            "tools[0].function.name",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"no_such_option": 1}, "no_such_option"),
    ],
)
def test_options_this_server_cannot_honour_are_refused(
    client: openai.OpenAI, extra: dict[str, object], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=USER, extra_body=extra)
    body = info.value.body
    assert isinstance(body, dict) and body["param"] == param and body["type"] == "invalid_request_error"


def test_a_long_prompt_reaches_the_backend_as_its_whole_encoding_sent_once_or_again(
    client: openai.OpenAI, served: Served, tok: ModelTokenizer
) -> None:
    """Over HTTP, a chat and a completion prompt long enough for the chunked encoding
    (``frontend/chunked.py``): the backend gets exactly the whole text's ids, a second time from
    the memo, and a grown prompt's ids again exact."""
    words = " ".join(["international understanding"] * 700)  # 19,599 characters, 1,400 tokens
    assert tok.chunked is not None and len(words) > 16_384
    sent = []
    for text in (words, words, words + " One more turn."):
        r = client.completions.create(model=MODEL, prompt=text, max_tokens=1)
        request = served.backend.requests[-1]
        sent.append(request.token_ids)
        assert list(request.token_ids) == tok.encode(text, add_special_tokens=True)
        assert r.usage is not None and r.usage.prompt_tokens == len(request.token_ids)
    assert sent[1] is sent[0] and sent[2] != sent[0]  # the same tuple when sent again
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": words}], max_tokens=1
    )
    template = tok.chat_template
    assert template is not None and chat.usage is not None
    rendered = template.render([{"role": "user", "content": words}], add_generation_prompt=True)
    assert list(served.backend.requests[-1].token_ids) == tok.encode(rendered, add_special_tokens=False)
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(served.url + "/metrics").text)}
    counts = {s.labels["result"]: s.value for s in families["interlock_prompt_chunks"].samples}
    assert counts["prompt_hit"] >= 1 and counts["chunk_miss"] >= 1 and counts["chunk_hit"] >= 1
    assert families["interlock_prompt_cache_tokens"].samples[0].value >= len(sent[2])
