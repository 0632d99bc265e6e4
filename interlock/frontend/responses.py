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
from interlock.frontend.tool_parsers import ToolCallDelta, ToolStreamParser
from interlock.protocol import TokenLogprobs

log = logging.getLogger(__name__)
DONE = b"data: [DONE]\n\n"
_encode = msgspec.json.Encoder().encode


def sse(payload: Any) -> bytes:
    return b"data: " + _encode(payload) + b"\n\n"


def usage(a: OutputAssembler | Sequence[OutputAssembler], prompts: int = 1) -> dict[str, Any]:
    """A request's usage: every choice's completion tokens, and the prompt once per prompt (the
    first ``prompts`` assemblers are the first choice of each prompt), as OpenAI counts ``n``."""
    choices = [a] if isinstance(a, OutputAssembler) else list(a)
    prompt = sum(c.prompt_tokens for c in choices[:prompts])
    completion = sum(c.completion_tokens for c in choices)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": sum(c.cached_tokens for c in choices[:prompts])},
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

    def __init__(
        self,
        request_id: str,
        model: str,
        created: int,
        tokenizer: ModelTokenizer,
        *,
        token_ids_as_text: bool = False,
        continuous_usage: OutputAssembler | None = None,
        index: int = 0,
    ) -> None:
        """``token_ids_as_text`` (vLLM's ``return_tokens_as_token_ids``): logprobs name tokens
        as ``token_id:N``; ``continuous_usage`` (``stream_options.continuous_usage_stats``):
        every chunk carries this assembler's usage so far; ``index``: the choice's."""
        self.index = index
        self.request_id = request_id
        self.model = model
        self.created = created
        self._tok = tokenizer
        self._token_ids_as_text = token_ids_as_text
        self._continuous_usage = continuous_usage
        self._head = {"id": request_id, "object": self.chunk_object, "created": created, "model": model}
        head = _encode({**self._head, "choices": None})[: -len(b"null}")]
        self._text_prefix = b"data: " + head + b'[{"index":%d,' % index + self._text_open
        self._text_suffix = self._text_close + b',"logprobs":null,"finish_reason":null}]}\n\n'

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        if self._continuous_usage is not None and "usage" not in extra:
            extra["usage"] = usage(self._continuous_usage)
        return sse({**self._head, "choices": choices, **extra})

    def _plain(self, delta: Delta) -> bool:
        """A text-only chunk, built from the prepared bytes (the hot path)."""
        return (
            delta.logprobs is None
            and delta.finish_reason is None
            and delta.prompt_logprobs is None
            and self._continuous_usage is None
        )

    def _prompt_logprobs(self, entries: Sequence[TokenLogprobs]) -> list[dict[str, Any] | None]:
        """vLLM's ``prompt_logprobs``: None for the first prompt token, then per position the
        prompt token's logprob and the top alternatives', by token id (its rank when among them)."""
        out: list[dict[str, Any] | None] = [None]
        for lp in entries:
            ranks = {token_id: rank for rank, (token_id, _) in enumerate(lp.top, 1)}
            position = {str(lp.token_id): self._ranked(lp.token_id, lp.logprob, ranks.get(lp.token_id))}
            for token_id, logprob in lp.top:
                position.setdefault(str(token_id), self._ranked(token_id, logprob, ranks[token_id]))
            out.append(position)
        return out

    def _ranked(self, token_id: int, logprob: float, rank: int | None) -> dict[str, Any]:
        return {"logprob": logprob, "rank": rank, "decoded_token": self._token(token_id)[0]}

    def _choice(
        self, key: str, value: Any, logprobs: Sequence[TokenLogprobs] | None, finish_reason: str | None
    ) -> dict[str, Any]:
        return {
            "index": self.index,
            key: value,
            "logprobs": self._logprobs(logprobs),
            "finish_reason": finish_reason,
        }

    def _logprobs(self, logprobs: Sequence[TokenLogprobs] | None) -> dict[str, Any] | None:
        raise NotImplementedError

    def usage_chunk(self, body: dict[str, Any]) -> bytes:
        return self._chunk([], usage=body)

    def body(self, choices: list[dict[str, Any]], usage_body: dict[str, Any]) -> dict[str, Any]:
        """The whole non-streamed response around its choices (``choice``'s)."""
        return {**self._head, "object": self.object_name, "choices": choices, "usage": usage_body}

    def _token(self, token_id: int) -> tuple[str, bytes]:
        if self._token_ids_as_text:
            text = f"token_id:{token_id}"
            return text, text.encode()
        raw = self._tok.token_bytes(token_id)
        return raw.decode("utf-8", errors="replace"), raw


class ChatFormatter(_Formatter):
    object_name = "chat.completion"
    chunk_object = "chat.completion.chunk"
    _text_open = b'"delta":{"content":'
    _text_close = b"}"

    def __init__(
        self,
        request_id: str,
        model: str,
        created: int,
        tokenizer: ModelTokenizer,
        *,
        tool_calls: ToolStreamParser | None = None,
        parallel_tool_calls: bool = True,
        **options: Any,
    ) -> None:
        """``tool_calls``: the request offers tools; the text goes through this parser, which
        turns calls into ``tool_calls`` (only the first with ``parallel_tool_calls`` false) and
        passes the rest on as content; a reply with calls finishes with "tool_calls"."""
        super().__init__(request_id, model, created, tokenizer, **options)
        self._sent_role = False
        self._tools = tool_calls
        self._parallel = parallel_tool_calls
        self._prompt: list[dict[str, Any] | None] | None = None  # vLLM's, top level on chat

    def chunk(self, delta: Delta) -> bytes:
        if self._tools is not None:
            return self._tool_chunk(delta)
        if self._sent_role and self._plain(delta):
            return self._text_prefix + _encode(delta.text) + self._text_suffix
        body: dict[str, Any] = {}
        if not self._sent_role:
            body["role"] = "assistant"
            self._sent_role = True
        if delta.text or "role" in body:
            body["content"] = delta.text
        return self._chunk(
            [self._choice("delta", body, delta.logprobs, delta.finish_reason)], **self._extra(delta)
        )

    def _extra(self, delta: Delta) -> dict[str, Any]:
        if delta.prompt_logprobs is None:
            return {}
        return {"prompt_logprobs": self._prompt_logprobs(delta.prompt_logprobs)}

    def body(self, choices: list[dict[str, Any]], usage_body: dict[str, Any]) -> dict[str, Any]:
        body = super().body(choices, usage_body)
        if self._prompt is not None:
            body["prompt_logprobs"] = self._prompt
        return body

    def choice(
        self,
        text: str,
        logprobs: Sequence[TokenLogprobs] | None,
        finish_reason: str | None,
        prompt_logprobs: Sequence[TokenLogprobs] | None = None,
    ) -> dict[str, Any]:
        if prompt_logprobs is not None:
            self._prompt = self._prompt_logprobs(prompt_logprobs)
        message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
        if self._tools is not None:
            content, calls, finish_reason = self._split(text, finish_reason)
            message["content"] = (content or None) if calls else content
            if calls:
                message["tool_calls"] = [
                    {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                    for c in calls
                ]
        return self._choice("message", message, logprobs, finish_reason)

    def _tool_chunk(self, delta: Delta) -> bytes:
        content, calls, finish_reason = self._split(delta.text, delta.finish_reason)
        body: dict[str, Any] = {}
        if not self._sent_role:
            body["role"] = "assistant"
            self._sent_role = True
        if content or "role" in body:
            body["content"] = content
        if calls:
            body["tool_calls"] = [c.to_openai() for c in calls]
        if (
            len(body) == 0
            and delta.logprobs is None
            and finish_reason is None
            and delta.prompt_logprobs is None
        ):
            return b""
        return self._chunk([self._choice("delta", body, delta.logprobs, finish_reason)], **self._extra(delta))

    def _split(self, text: str, finish_reason: str | None) -> tuple[str, list[ToolCallDelta], str | None]:
        """The text's content and whole calls, and the finish reason, through the parser."""
        assert self._tools is not None
        content, calls = self._tools.split(
            text, last=finish_reason is not None, max_calls=None if self._parallel else 1
        )
        if finish_reason == "stop" and self._tools.call_count:
            finish_reason = "tool_calls"
        return content, calls, finish_reason

    def _logprobs(self, logprobs: Sequence[TokenLogprobs] | None) -> dict[str, Any] | None:
        if logprobs is None:
            return None
        return {"content": [self._entry(lp) for lp in logprobs], "refusal": None}

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

    def __init__(
        self,
        request_id: str,
        model: str,
        created: int,
        tokenizer: ModelTokenizer,
        *,
        echo: str = "",
        echo_first_token: int | None = None,
        **options: Any,
    ) -> None:
        """``echo``: the prompt's text, sent before the completion's; ``echo_first_token``: with
        logprobs, the prompt's first token id (the prompt's logprobs then lead the arrays, as
        OpenAI's echo gives them: the first token's logprob null)."""
        super().__init__(request_id, model, created, tokenizer, **options)
        self._text_offset = 0
        self._echo = echo
        self._echo_first = echo_first_token
        self._prompt_part: Sequence[TokenLogprobs] | None = None

    def chunk(self, delta: Delta) -> bytes:
        text, self._echo = self._echo + delta.text, ""
        if self._plain(delta):
            return self._text_prefix + _encode(text) + self._text_suffix
        choice = self._choice_with(text, delta.logprobs, delta.finish_reason, delta.prompt_logprobs)
        return self._chunk([choice])

    def choice(
        self,
        text: str,
        logprobs: Sequence[TokenLogprobs] | None,
        finish_reason: str | None,
        prompt_logprobs: Sequence[TokenLogprobs] | None = None,
    ) -> dict[str, Any]:
        text, self._echo = self._echo + text, ""
        return self._choice_with(text, logprobs, finish_reason, prompt_logprobs)

    def _choice_with(
        self,
        text: str,
        logprobs: Sequence[TokenLogprobs] | None,
        finish_reason: str | None,
        prompt_logprobs: Sequence[TokenLogprobs] | None,
    ) -> dict[str, Any]:
        self._prompt_part = prompt_logprobs if self._echo_first is not None else None
        choice = self._choice("text", text, logprobs, finish_reason)
        if prompt_logprobs is not None:
            choice["prompt_logprobs"] = self._prompt_logprobs(prompt_logprobs)
        return choice

    def _logprobs(self, logprobs: Sequence[TokenLogprobs] | None) -> dict[str, Any] | None:
        if logprobs is None:
            return None
        tokens: list[str] = []
        token_logprobs: list[float | None] = []
        tops: list[dict[str, float] | None] = []
        offsets: list[int] = []
        if self._prompt_part is not None and self._echo_first is not None:  # echo: the prompt first
            first, _ = self._token(self._echo_first)
            tokens.append(first)
            token_logprobs.append(None)
            tops.append(None)
            offsets.append(self._text_offset)
            self._text_offset += len(first)
            logprobs = [*self._prompt_part, *logprobs]
            self._prompt_part = None
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
