"""OpenAI response shapes: chat.completion(.chunk), text_completion, usage, logprobs, errors.

One formatter per request knows its id, model and creation time. Streaming chunks are SSE events
(``data: {...}\\n\\n``). The common chunk (text only) is the hot path of the whole frontend, so it
is built from bytes prepared once per request around the JSON-encoded text; other chunks are
encoded from dicts.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import msgspec

from interlock.errors import (
    EngineError,
    InterlockError,
    ModelNotFound,
    NoWorkers,
    Overloaded,
    PromptTooLong,
    RequestError,
    ServiceUnavailable,
    TransportError,
)
from interlock.frontend.assembler import Delta, OutputAssembler
from interlock.frontend.tokenizer import ModelTokenizer
from interlock.protocol import TokenLogprobs

log = logging.getLogger(__name__)
DONE = b"data: [DONE]\n\n"
_encode = msgspec.json.Encoder().encode


def sse(payload: Any) -> bytes:
    return b"data: " + _encode(payload) + b"\n\n"


def usage(a: OutputAssembler) -> dict[str, Any]:
    return {
        "prompt_tokens": a.prompt_tokens,
        "completion_tokens": a.completion_tokens,
        "total_tokens": a.total_tokens,
        "prompt_tokens_details": {"cached_tokens": a.cached_tokens},
    }


# What a client reads when the server failed. The real message of a service fault names
# internal addresses, paths and peers ("connection to 10.0.0.7:4222 lost"): it goes to the log,
# and the client gets the fault's kind. Most specific class first.
_CLIENT_MESSAGES: tuple[tuple[type[InterlockError], str], ...] = (
    (NoWorkers, "no worker is serving this model right now; retry later"),
    (Overloaded, "the server is overloaded; retry later"),
    (ServiceUnavailable, "the service is unavailable; retry later"),
    (TransportError, "a connection inside the service failed while serving the request"),
    (EngineError, "the engine failed while running the request"),
)


def error_body(exc: InterlockError) -> dict[str, Any]:
    return {
        "error": {
            "message": client_message(exc),
            "type": exc.error_type,
            "param": exc.param,
            "code": error_code(exc),
        }
    }


def client_message(exc: InterlockError) -> str:
    """``exc``'s message if it is about the request, a generic one (the real one logged) if not."""
    if isinstance(exc, RequestError):
        return exc.message
    message = next((m for cls, m in _CLIENT_MESSAGES if isinstance(exc, cls)), "internal server error")
    if exc.message != message:
        log.warning("%s shown to the client as %r: %s", type(exc).__name__, message, exc.message)
    return message


def error_code(exc: InterlockError) -> str:
    if isinstance(exc, PromptTooLong):
        return "context_length_exceeded"
    if isinstance(exc, ModelNotFound):
        return "model_not_found"
    return exc.code


class _Formatter:
    object_name = ""
    chunk_object = ""
    _text_open = b""
    _text_close = b""
    """A text-only chunk's choice around its text: what follows ``{"index":0,`` and what comes
    before ``,"logprobs":null,...``."""

    def __init__(self, request_id: str, model: str, created: int, tokenizer: ModelTokenizer) -> None:
        self.request_id = request_id
        self.model = model
        self.created = created
        self._tok = tokenizer
        self._head = {"id": request_id, "object": self.chunk_object, "created": created, "model": model}
        head = _encode({**self._head, "choices": None})[: -len(b"null}")]
        self._text_prefix = b"data: " + head + b'[{"index":0,' + self._text_open
        self._text_suffix = self._text_close + b',"logprobs":null,"finish_reason":null}]}\n\n'

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return sse({**self._head, "choices": choices, **extra})

    def _choice(
        self, key: str, value: Any, logprobs: Sequence[TokenLogprobs] | None, finish_reason: str | None
    ) -> dict[str, Any]:
        return {"index": 0, key: value, "logprobs": self._logprobs(logprobs), "finish_reason": finish_reason}

    def _logprobs(self, logprobs: Sequence[TokenLogprobs] | None) -> dict[str, Any] | None:
        raise NotImplementedError

    def usage_chunk(self, a: OutputAssembler) -> bytes:
        return self._chunk([], usage=usage(a))

    def _token(self, token_id: int) -> tuple[str, bytes]:
        raw = self._tok.token_bytes(token_id)
        return raw.decode("utf-8", errors="replace"), raw


class ChatFormatter(_Formatter):
    object_name = "chat.completion"
    chunk_object = "chat.completion.chunk"
    _text_open = b'"delta":{"content":'
    _text_close = b"}"

    def __init__(self, request_id: str, model: str, created: int, tokenizer: ModelTokenizer) -> None:
        super().__init__(request_id, model, created, tokenizer)
        self._sent_role = False

    def chunk(self, delta: Delta) -> bytes:
        if self._sent_role and delta.logprobs is None and delta.finish_reason is None:
            return self._text_prefix + _encode(delta.text) + self._text_suffix
        body: dict[str, Any] = {}
        if not self._sent_role:
            body["role"] = "assistant"
            self._sent_role = True
        if delta.text or "role" in body:
            body["content"] = delta.text
        return self._chunk([self._choice("delta", body, delta.logprobs, delta.finish_reason)])

    def response(
        self, text: str, logprobs: Sequence[TokenLogprobs] | None, a: OutputAssembler
    ) -> dict[str, Any]:
        message = {"role": "assistant", "content": text}
        choice = self._choice("message", message, logprobs, a.finish_reason)
        head = {**self._head, "object": self.object_name}
        return {**head, "choices": [choice], "usage": usage(a)}

    def _logprobs(self, logprobs: Sequence[TokenLogprobs] | None) -> dict[str, Any] | None:
        if logprobs is None:
            return None
        return {"content": [self._entry(lp) for lp in logprobs]}

    def _entry(self, lp: TokenLogprobs) -> dict[str, Any]:
        text, raw = self._token(lp.token_id)
        return {"token": text, "logprob": lp.logprob, "bytes": list(raw), "top_logprobs": self._top(lp)}

    def _top(self, lp: TokenLogprobs) -> list[dict[str, Any]]:
        top = []
        for token_id, logprob in lp.top:
            text, raw = self._token(token_id)
            top.append({"token": text, "logprob": logprob, "bytes": list(raw)})
        return top


class CompletionFormatter(_Formatter):
    object_name = "text_completion"
    chunk_object = "text_completion"
    _text_open = b'"text":'

    def __init__(self, request_id: str, model: str, created: int, tokenizer: ModelTokenizer) -> None:
        super().__init__(request_id, model, created, tokenizer)
        self._text_offset = 0

    def chunk(self, delta: Delta) -> bytes:
        if delta.logprobs is None and delta.finish_reason is None:
            return self._text_prefix + _encode(delta.text) + self._text_suffix
        return self._chunk([self._choice("text", delta.text, delta.logprobs, delta.finish_reason)])

    def response(
        self, text: str, logprobs: Sequence[TokenLogprobs] | None, a: OutputAssembler
    ) -> dict[str, Any]:
        choice = self._choice("text", text, logprobs, a.finish_reason)
        return {**self._head, "choices": [choice], "usage": usage(a)}

    def _logprobs(self, logprobs: Sequence[TokenLogprobs] | None) -> dict[str, Any] | None:
        if logprobs is None:
            return None
        tokens, token_logprobs, tops, offsets = [], [], [], []
        for lp in logprobs:
            text, _ = self._token(lp.token_id)
            tokens.append(text)
            token_logprobs.append(lp.logprob)
            tops.append({self._token(t)[0]: v for t, v in lp.top})
            offsets.append(self._text_offset)
            self._text_offset += len(text)
        return {
            "tokens": tokens,
            "token_logprobs": token_logprobs,
            "top_logprobs": tops,
            "text_offset": offsets,
        }
