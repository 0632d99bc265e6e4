"""OpenAI request bodies: typed, decoded and validated in one msgspec pass.

Bodies decode straight into frozen structs; a wrong type, a missing field or an unknown one
becomes ``InvalidRequest`` naming the field. Nothing is accepted and ignored: a client that sends
``tools`` or a JSON ``response_format`` expects them to shape the output, so everything this
server cannot honour (tools, structured output, ``n > 1``, penalties, ``echo``, ``best_of``) is
refused with a 400 instead of answered as if it had been applied. ``user`` is the one field with
no effect on the output, as at OpenAI: it is an end-user id for the logs.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

import msgspec

from interlock.errors import InvalidRequest
from interlock.frontend.limits import (
    DEFAULT_MAX_JSON_DEPTH,
    MAX_INT32,
    MAX_PRIORITY,
    MIN_PRIORITY,
    check_depth,
    depth_error,
)
from interlock.protocol.sampling import MAX_TOP_LOGPROBS

MAX_STOP_STRINGS = 16


class StreamOptions(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    include_usage: bool = False


class ContentPart(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    type: str
    text: str | None = None


class ChatMessage(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    # No name / tool_calls / tool_call_id: without tool support a chat template would drop them
    # silently; as unknown fields they are refused by name.
    role: str
    content: str | list[ContentPart] | None = None


class _Sampling(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Fields shared by both endpoints."""

    model: str
    max_tokens: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[Annotated[int, msgspec.Meta(ge=0, le=MAX_INT32)]] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: Annotated[int, msgspec.Meta(le=MAX_INT32)] | None = None  # must fit msgpack (limits.py)
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
    repetition_penalty: float | None = None
    """vLLM's extension; only its neutral 1.0 (what ``vllm bench serve`` always sends)."""
    priority: Annotated[int, msgspec.Meta(ge=MIN_PRIORITY, le=MAX_PRIORITY)] | None = None
    user: str | None = None


class ChatCompletionRequest(_Sampling, frozen=True, kw_only=True):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    tools: list[Any] | None = None
    tool_choice: Any = None
    response_format: Any = None


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


def parse_chat(body: bytes, *, max_depth: int = DEFAULT_MAX_JSON_DEPTH) -> ChatCompletionRequest:
    req: ChatCompletionRequest = _decode(_chat_decoder, body, max_depth)
    for name in ("tools", "tool_choice", "response_format"):  # the free-form (Any) fields
        check_depth(getattr(req, name), max_depth, param=name)
    if req.tools:
        raise InvalidRequest("tools are not supported by this server", param="tools")
    if req.tool_choice not in (None, "none"):
        raise InvalidRequest('tool_choice is not supported by this server (only "none")', param="tool_choice")
    if req.response_format not in (None, {"type": "text"}):
        raise InvalidRequest(
            'response_format is not supported by this server (only {"type": "text"})',
            param="response_format",
        )
    if not req.messages:
        raise InvalidRequest("messages must contain at least one message", param="messages")
    if req.top_logprobs is not None and not req.logprobs:
        raise InvalidRequest("top_logprobs requires logprobs to be true", param="top_logprobs")
    for i, message in enumerate(req.messages):
        _content_text(message.content, i)  # refuses non-text parts now, not at templating
    _check_common(req)
    return req


def parse_completion(body: bytes, *, max_depth: int = DEFAULT_MAX_JSON_DEPTH) -> CompletionRequest:
    req: CompletionRequest = _decode(_completion_decoder, body, max_depth)
    check_depth(req.prompt, max_depth, param="prompt")
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


def prompt_chars(req: ChatCompletionRequest | CompletionRequest) -> tuple[int, str]:
    """The prompt's size in characters (token ids count one each) and the field holding it."""
    if isinstance(req, ChatCompletionRequest):
        return sum(len(_content_text(m.content, i)) for i, m in enumerate(req.messages)), "messages"
    return _prompt_size(req.prompt), "prompt"


def stop_strings(req: _Sampling) -> tuple[str, ...]:
    if req.stop is None:
        return ()
    return (req.stop,) if isinstance(req.stop, str) else tuple(req.stop)


def _decode(decoder: msgspec.json.Decoder[Any], body: bytes, max_depth: int) -> Any:
    try:
        return decoder.decode(body)
    except RecursionError:  # only the Any fields can nest this deep; msgspec gives up first
        raise depth_error(max_depth, param=None) from None
    except msgspec.ValidationError as exc:
        raise InvalidRequest(f"invalid request: {exc}", param=_param_of(str(exc))) from exc
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"malformed JSON body: {exc}") from exc


def _param_of(message: str) -> str | None:
    path, field = _PATH.search(message), _FIELD.search(message)
    parts = [m.group(1) for m in (path, field) if m and m.group(1)]
    return ".".join(parts) or None


def _check_common(req: _Sampling) -> None:
    if req.n not in (None, 1):
        raise InvalidRequest("n must be 1: one choice per request is supported", param="n")
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(req, name):
            raise InvalidRequest(f"{name} is not supported", param=name)
    if req.repetition_penalty not in (None, 1.0):
        raise InvalidRequest(
            "repetition_penalty is not supported (only 1.0, no penalty)", param="repetition_penalty"
        )
    if req.stream_options is not None and not req.stream:
        raise InvalidRequest("stream_options is only allowed when stream is true", param="stream_options")
    if req.stop is not None and not isinstance(req.stop, str) and len(req.stop) > MAX_STOP_STRINGS:
        raise InvalidRequest(f"at most {MAX_STOP_STRINGS} stop strings are supported", param="stop")


def _message_dict(message: ChatMessage, index: int) -> dict[str, Any]:
    return {"role": message.role, "content": _content_text(message.content, index)}


def _prompt_size(prompt: object) -> int:
    if isinstance(prompt, str):
        return len(prompt)
    if isinstance(prompt, list):  # depth already checked: the recursion is bounded
        return sum(_prompt_size(p) if isinstance(p, (str, list)) else 1 for p in prompt)
    return 1


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
