"""OpenAI request bodies: typed, decoded and validated in one msgspec pass.

Bodies decode straight into frozen structs (unknown fields are ignored, as OpenAI clients send
many optional ones); a wrong type or a missing field becomes ``InvalidRequest`` naming the field.
The sampling fields map onto ``SamplingParams``; everything this server cannot honour (``n > 1``,
penalties, ``echo``, ``best_of``) is refused with a 400 rather than silently ignored.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from interlock.errors import InvalidRequest
from interlock.protocol.sampling import MAX_TOP_LOGPROBS


class StreamOptions(msgspec.Struct, frozen=True):
    include_usage: bool = False


class ContentPart(msgspec.Struct, frozen=True):
    type: str
    text: str | None = None


class ChatMessage(msgspec.Struct, frozen=True):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[Any] | None = None
    tool_call_id: str | None = None


class _Sampling(msgspec.Struct, frozen=True, kw_only=True):
    """Fields shared by both endpoints."""

    model: str
    max_tokens: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    n: int | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    priority: int | None = None
    user: str | None = None


class ChatCompletionRequest(_Sampling, frozen=True, kw_only=True):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    tools: Any = None
    tool_choice: Any = None


class CompletionRequest(_Sampling, frozen=True, kw_only=True):
    prompt: str | list[Any]
    logprobs: int | None = None
    echo: bool | None = False
    best_of: int | None = None
    suffix: str | None = None


_chat_decoder = msgspec.json.Decoder(ChatCompletionRequest)
_completion_decoder = msgspec.json.Decoder(CompletionRequest)
_PATH = re.compile(r"at `\$\.?([^`]*)`")
_FIELD = re.compile(r"field `([^`]*)`")


def parse_chat(body: bytes) -> ChatCompletionRequest:
    req = _decode(_chat_decoder, body)
    if not req.messages:
        raise InvalidRequest("messages must contain at least one message", param="messages")
    if req.top_logprobs is not None and not req.logprobs:
        raise InvalidRequest("top_logprobs requires logprobs to be true", param="top_logprobs")
    _check_common(req)
    return req


def parse_completion(body: bytes) -> CompletionRequest:
    req = _decode(_completion_decoder, body)
    if req.echo:
        raise InvalidRequest("echo is not supported", param="echo")
    if req.best_of not in (None, 1):
        raise InvalidRequest("best_of must be 1", param="best_of")
    if req.suffix:
        raise InvalidRequest("suffix is not supported", param="suffix")
    if req.logprobs is not None and not 0 <= req.logprobs <= MAX_TOP_LOGPROBS:
        raise InvalidRequest(f"logprobs must be between 0 and {MAX_TOP_LOGPROBS}", param="logprobs")
    _check_common(req)
    return req


def chat_messages(req: ChatCompletionRequest) -> list[dict[str, Any]]:
    """Messages as the plain dicts a chat template expects; content parts joined into text."""
    return [_message_dict(m, i) for i, m in enumerate(req.messages)]


def completion_prompt(req: CompletionRequest) -> str | list[int]:
    """The single prompt: a string or a list of token ids (a batch of one is unwrapped)."""
    prompt = req.prompt
    if isinstance(prompt, str):
        return prompt
    if len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
        if isinstance(prompt, str):
            return prompt
    if prompt and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt):
        return list(prompt)
    if prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise InvalidRequest("only one prompt per request is supported", param="prompt")
    raise InvalidRequest("prompt must be a string or a list of non-negative token ids", param="prompt")


def stop_strings(req: _Sampling) -> tuple[str, ...]:
    if req.stop is None:
        return ()
    return (req.stop,) if isinstance(req.stop, str) else tuple(req.stop)


def _decode(decoder: msgspec.json.Decoder[Any], body: bytes) -> Any:
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise InvalidRequest(f"invalid request: {exc}", param=_param_of(str(exc))) from exc
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"malformed JSON body: {exc}") from exc


def _param_of(message: str) -> str | None:
    match = _PATH.search(message) or _FIELD.search(message)
    return match.group(1) if match and match.group(1) else None


def _check_common(req: _Sampling) -> None:
    if req.n not in (None, 1):
        raise InvalidRequest("n must be 1: one choice per request is supported", param="n")
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(req, name):
            raise InvalidRequest(f"{name} is not supported", param=name)
    if req.stop is not None and not isinstance(req.stop, str) and len(req.stop) > 16:
        raise InvalidRequest("at most 16 stop strings are supported", param="stop")


def _message_dict(message: ChatMessage, index: int) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.role, "content": _content_text(message.content, index)}
    if message.name is not None:
        out["name"] = message.name
    if message.tool_calls is not None:
        out["tool_calls"] = message.tool_calls
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    return out


def _content_text(content: str | list[ContentPart] | None, index: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for part in content:
        if part.type != "text" or part.text is None:
            raise InvalidRequest(
                f"message {index}: only text content parts are supported (got {part.type!r})",
                param=f"messages[{index}].content",
            )
        texts.append(part.text)
    return "".join(texts)
