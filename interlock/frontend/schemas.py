"""OpenAI request bodies: typed, decoded and validated in one msgspec pass.

Bodies decode straight into frozen structs; a wrong type, a missing field or an unknown one
becomes ``InvalidRequest`` naming the field. Nothing is accepted and ignored: a field either
changes what the server does or, where this server cannot honour it, is refused with a 400
naming it; neutral values (``store: false``, an empty ``logit_bias``, a penalty of 1.0) are always
accepted, and a whole number written as a float is that number. ``user``, ``safety_identifier``
and ``metadata`` have no effect on the output, as at OpenAI: they go to the access log.
``docs/openai.md`` lists every field and what it does (checked by tests/frontend/test_schemas.py).
"""

from __future__ import annotations

import json
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
from interlock.frontend.tools import ToolSpec, parse_tool_spec
from interlock.protocol.sampling import MAX_TOP_LOGPROBS

MAX_STOP_STRINGS = 16
MAX_CHOICES = 64
MAX_LOGIT_BIAS = 1024
MAX_REPETITION_PENALTY = 10.0
MAX_METADATA_PAIRS = 16
MAX_ID_CHARS = 512
_TOKEN_ID = re.compile(r"[0-9]{1,10}")
_ROLES = ("system", "developer", "user", "assistant", "tool")
_CHAT_FREE_FORM = (
    "tools",
    "tool_choice",
    "chat_template_kwargs",
    "audio",
    "prediction",
    "web_search_options",
)
_CHAT_REFUSED = {
    "audio": "the model writes text only",
    "prediction": "predicted outputs are not used",
    "web_search_options": "the server has no web search",
    "functions": "use tools",
    "function_call": "use tool_choice",
}


class StreamOptions(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    include_usage: bool = False
    continuous_usage_stats: bool = False
    """vLLM's extension: the usage so far in every chunk."""


class ContentPart(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    type: str
    text: str | None = None
    refusal: str | None = None
    """An assistant's earlier refusal (``type: "refusal"``), kept as its text."""


class ToolCallFunction(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str
    arguments: str


class MessageToolCall(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    id: str
    function: ToolCallFunction
    type: str = "function"


class ChatMessage(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    """A participant's name: passed to the chat template, which may use it."""
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None
    refusal: str | None = None


class JsonSchemaFormat(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str
    description: str | None = None
    schema: Any = None
    strict: bool | None = None


class ResponseFormat(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    type: str
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """vLLM's ``structured_outputs`` field: exactly one constraint."""

    json: Any = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None


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
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    return_tokens_as_token_ids: bool = False
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    prompt_logprobs: Annotated[int, msgspec.Meta(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    """vLLM's: every prompt token's logprob and the top N at its position (computes the whole
    prompt: no prefix-cache hit)."""
    structured_outputs: StructuredOutputs | None = None
    priority: Annotated[int, msgspec.Meta(ge=MIN_PRIORITY, le=MAX_PRIORITY)] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None


class ChatCompletionRequest(_Sampling, frozen=True, kw_only=True):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    echo: bool = False
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    modalities: list[str] | None = None
    audio: Any = None
    prediction: Any = None
    web_search_options: Any = None
    functions: Any = None
    function_call: Any = None


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
    req: ChatCompletionRequest = decode_body(_chat_decoder, ChatCompletionRequest, body, max_depth)
    for name in _CHAT_FREE_FORM:
        check_depth(getattr(req, name), max_depth, param=name)
    if req.response_format is not None and req.response_format.json_schema is not None:
        check_depth(req.response_format.json_schema.schema, max_depth, param="response_format")
    if req.structured_outputs is not None:
        check_depth(req.structured_outputs.json, max_depth, param="structured_outputs")
    if req.tool_choice not in (None, "none") and not req.tools:
        raise InvalidRequest("tool_choice is only allowed when tools are given", param="tool_choice")
    spec = tool_spec(req)  # validated now, used when the prompt is rendered
    if spec.constrained and (req.response_format is not None and req.response_format.type != "text"):
        raise InvalidRequest(
            "a forced tool call (tool_choice required or a named function) already constrains the "
            "output: response_format must be text",
            param="response_format",
        )
    if spec.constrained and req.structured_outputs is not None:
        raise InvalidRequest(
            "a forced tool call already constrains the output: drop structured_outputs",
            param="structured_outputs",
        )
    for name, why in _CHAT_REFUSED.items():
        if getattr(req, name) is not None:
            raise InvalidRequest(f"{name} is not supported by this server: {why}", param=name)
    _check_choice(req.reasoning_effort, ("none",), "reasoning_effort", "the model does not reason")
    _check_choice(req.verbosity, ("medium",), "verbosity", "the model has one verbosity")
    if req.modalities is not None and list(req.modalities) != ["text"]:
        raise InvalidRequest('modalities must be ["text"]: the model writes text only', param="modalities")
    if req.echo:
        raise InvalidRequest("echo is not supported on chat completions", param="echo")
    if req.parallel_tool_calls is not None and not req.tools:
        raise InvalidRequest(
            "parallel_tool_calls is only allowed when tools are given", param="parallel_tool_calls"
        )
    fmt = req.response_format
    if fmt is not None and fmt.json_schema is not None and fmt.json_schema.description is not None:
        raise InvalidRequest(
            "response_format.json_schema.description is not supported: the schema alone shapes the output",
            param="response_format.json_schema.description",
        )
    if not req.messages:
        raise InvalidRequest("messages must contain at least one message", param="messages")
    if req.max_completion_tokens is not None and req.max_completion_tokens < 1:
        raise InvalidRequest("max_completion_tokens must be at least 1", param="max_completion_tokens")
    if req.top_logprobs is not None and not req.logprobs:
        raise InvalidRequest("top_logprobs requires logprobs to be true", param="top_logprobs")
    if req.continue_final_message:
        if req.add_generation_prompt:
            raise InvalidRequest(
                "continue_final_message and add_generation_prompt cannot both be true "
                "(set add_generation_prompt to false)",
                param="continue_final_message",
            )
        if req.messages[-1].role != "assistant":
            raise InvalidRequest(
                "continue_final_message needs the last message to be the assistant's",
                param="continue_final_message",
            )
    for i, message in enumerate(req.messages):
        _check_message(message, i)
    _check_common(req)
    return req


def parse_completion(body: bytes, *, max_depth: int = DEFAULT_MAX_JSON_DEPTH) -> CompletionRequest:
    req: CompletionRequest = decode_body(_completion_decoder, CompletionRequest, body, max_depth)
    check_depth(req.prompt, max_depth, param="prompt")
    if req.structured_outputs is not None:
        check_depth(req.structured_outputs.json, max_depth, param="structured_outputs")
    if req.best_of is not None:
        if not (req.n or 1) <= req.best_of <= MAX_CHOICES:
            raise InvalidRequest(f"best_of must be at least n and at most {MAX_CHOICES}", param="best_of")
        if req.stream and req.best_of > (req.n or 1):
            raise InvalidRequest(
                "best_of cannot be streamed (the best are known only at the end)", param="best_of"
            )
    if req.suffix:
        raise InvalidRequest(
            "suffix is not supported: the model has no fill-in-the-middle mode", param="suffix"
        )
    if req.logprobs is not None and not 0 <= req.logprobs <= MAX_TOP_LOGPROBS:
        raise InvalidRequest(f"logprobs must be between 0 and {MAX_TOP_LOGPROBS}", param="logprobs")
    _check_common(req)
    return req


def chat_messages(req: ChatCompletionRequest) -> list[dict[str, Any]]:
    """Messages as the plain dicts a chat template expects; content parts joined into text."""
    return chat_messages_of(req.messages)


def chat_messages_of(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    for i, message in enumerate(messages):
        _check_message(message, i)
    return [_message_dict(m, i) for i, m in enumerate(messages)]


def completion_prompt(req: CompletionRequest) -> str | list[int]:
    """The single prompt: a string or a list of token ids (a batch of one is unwrapped)."""
    prompts = completion_prompts(req)
    if len(prompts) > 1:
        raise InvalidRequest("only one prompt is allowed here", param="prompt")
    return prompts[0]


def completion_prompts(req: CompletionRequest) -> list[str | list[int]]:
    """The prompts of a completion request: one string, one list of token ids, or a batch of
    either (each prompt gets ``n`` choices, indexed prompt by prompt)."""
    prompt = req.prompt
    if isinstance(prompt, str):
        return [prompt]
    if _is_token_ids(prompt):
        return [list(prompt)]
    if prompt and all(isinstance(p, str) or (isinstance(p, list) and _is_token_ids(p)) for p in prompt):
        return list(prompt)
    raise InvalidRequest(
        "prompt must be a string, a list of non-negative token ids, or a batch of either", param="prompt"
    )


def _is_token_ids(value: list[Any]) -> bool:
    return bool(value) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)


def num_choices(req: ChatCompletionRequest | CompletionRequest, prompts: int) -> int:
    """The choices generated per prompt (``n``, or ``best_of``) for ``prompts`` prompts, all of
    them within ``MAX_CHOICES``."""
    n = 1 if req.n is None else req.n
    if isinstance(req, CompletionRequest) and req.best_of is not None:
        n = req.best_of
    if n * prompts > MAX_CHOICES:
        raise InvalidRequest(
            f"at most {MAX_CHOICES} choices per request (n or best_of, times the number of prompts)",
            param="n",
        )
    return n


def prompt_chars(req: ChatCompletionRequest | CompletionRequest) -> tuple[int, str]:
    """The prompt's size in characters (token ids count one each) and the field holding it."""
    if isinstance(req, ChatCompletionRequest):
        return sum(len(_content_text(m.content, i)) for i, m in enumerate(req.messages)), "messages"
    return _prompt_size(req.prompt), "prompt"


def structured_output(req: ChatCompletionRequest | CompletionRequest) -> tuple[str, str] | None:
    """The request's output constraint as (kind, spec) (``protocol.StructuredOutput``'s fields),
    from ``response_format`` (chat) or vLLM's ``structured_outputs``; None when there is none.
    The spec is only shaped here: the grammar engine compiles it (and refuses a bad one)."""
    found = []
    fmt = req.response_format if isinstance(req, ChatCompletionRequest) else None
    if fmt is not None:
        found.append(_from_response_format(fmt))
    so = req.structured_outputs
    if so is not None:
        kinds = [
            (kind, value)
            for kind, value in (
                ("json_schema", so.json),
                ("regex", so.regex),
                ("choice", so.choice),
                ("grammar", so.grammar),
                ("json_object", so.json_object or None),
            )
            if value is not None
        ]
        if len(kinds) != 1:
            raise InvalidRequest(
                "structured_outputs takes exactly one of json, regex, choice, grammar, json_object",
                param="structured_outputs",
            )
        kind, value = kinds[0]
        found.append((kind, _spec_text(kind, value)))
    found = [f for f in found if f is not None]
    if len(found) > 1:
        raise InvalidRequest(
            "response_format and structured_outputs cannot both constrain the output",
            param="structured_outputs",
        )
    return found[0] if found else None


def _from_response_format(fmt: ResponseFormat) -> tuple[str, str] | None:
    if fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return ("json_object", "")
    if fmt.type == "json_schema":
        if fmt.json_schema is None:
            raise InvalidRequest(
                'response_format of type "json_schema" needs a json_schema object', param="response_format"
            )
        schema = fmt.json_schema.schema
        if schema is None:
            return ("json_object", "")
        if not isinstance(schema, dict):
            raise InvalidRequest(
                "response_format.json_schema.schema must be an object", param="response_format"
            )
        if fmt.json_schema.strict:
            schema = closed_objects(schema)
        return ("json_schema", json.dumps(schema))
    raise InvalidRequest(
        f'response_format.type must be "text", "json_object" or "json_schema" (got {fmt.type!r})',
        param="response_format",
    )


def closed_objects(schema: Any) -> Any:
    """``schema`` as OpenAI's strict mode reads it: an object schema that does not say whether
    it allows more properties allows none (``additionalProperties: false``). Without it a small
    model may invent keys until ``max_tokens``; a schema that says otherwise is kept as it is."""
    if isinstance(schema, list):
        return [closed_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    kept = ("enum", "const", "default", "examples")
    out = {k: v if k in kept else closed_objects(v) for k, v in schema.items()}
    is_object = out.get("type") == "object" or (isinstance(out.get("properties"), dict) and "type" not in out)
    if is_object and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def _spec_text(kind: str, value: Any) -> str:
    if kind == "json_object":
        return ""
    if kind == "json_schema":
        if isinstance(value, str):
            return value
        if not isinstance(value, dict):
            raise InvalidRequest(
                "structured_outputs.json must be a schema object", param="structured_outputs"
            )
        return json.dumps(value)
    if kind == "choice":
        if not value or not all(isinstance(c, str) and c for c in value):
            raise InvalidRequest(
                "structured_outputs.choice must be a list of non-empty strings", param="structured_outputs"
            )
        return json.dumps(value)
    return str(value)


def stop_strings(req: _Sampling) -> tuple[str, ...]:
    if req.stop is None:
        return ()
    return (req.stop,) if isinstance(req.stop, str) else tuple(req.stop)


def decode_body(decoder: msgspec.json.Decoder[Any], kind: type[Any], body: bytes, max_depth: int) -> Any:
    try:
        try:
            return decoder.decode(body)
        except msgspec.ValidationError as exc:
            if "got `float`" not in str(exc):
                raise
        # A whole number written as a float (``"max_tokens": 16.0``, as JavaScript clients and
        # some SDKs write them) is that number, as OpenAI reads it: convert integral floats and
        # decode again, strictly (a string is still no number).
        return msgspec.convert(_integral(msgspec.json.decode(body), max_depth), kind, strict=True)
    except RecursionError:  # only the Any fields can nest this deep; msgspec gives up first
        raise depth_error(max_depth, param=None) from None
    except msgspec.ValidationError as exc:
        raise InvalidRequest(f"invalid request: {exc}", param=_param_of(str(exc))) from exc
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"malformed JSON body: {exc}") from exc


def _integral(value: Any, depth: int) -> Any:
    """``value`` with every float that is a whole number made an int (to ``depth`` levels)."""
    if depth < 0:
        raise RecursionError
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _integral(v, depth - 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_integral(v, depth - 1) for v in value]
    return value


def _param_of(message: str) -> str | None:
    path, field = _PATH.search(message), _FIELD.search(message)
    parts = [m.group(1) for m in (path, field) if m and m.group(1)]
    return ".".join(parts) or None


def _check_common(req: ChatCompletionRequest | CompletionRequest) -> None:
    if req.n is not None and not 1 <= req.n <= MAX_CHOICES:
        raise InvalidRequest(f"n must be between 1 and {MAX_CHOICES}", param="n")
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(req, name)
        if value is not None and not -2.0 <= value <= 2.0:
            raise InvalidRequest(f"{name} must be between -2 and 2", param=name)
    if req.repetition_penalty is not None and not 0.0 < req.repetition_penalty <= MAX_REPETITION_PENALTY:
        raise InvalidRequest(
            f"repetition_penalty must be in (0, {MAX_REPETITION_PENALTY}]", param="repetition_penalty"
        )
    logit_bias(req)  # checked now, used when the sampling parameters are built
    structured_output(req)  # shaped now; compiled (and a bad spec refused) before any work
    if req.stream_options is not None and not req.stream:
        raise InvalidRequest("stream_options is only allowed when stream is true", param="stream_options")
    if req.stop is not None and not isinstance(req.stop, str) and len(req.stop) > MAX_STOP_STRINGS:
        raise InvalidRequest(f"at most {MAX_STOP_STRINGS} stop strings are supported", param="stop")
    if req.store:
        raise InvalidRequest("store must be false: this server keeps no completions", param="store")
    _check_choice(req.service_tier, ("auto", "default"), "service_tier", "there is one tier")
    if not req.spaces_between_special_tokens:
        raise InvalidRequest(
            "spaces_between_special_tokens=false is not supported (the tokenizer decodes special "
            "tokens as they are)",
            param="spaces_between_special_tokens",
        )
    if req.metadata is not None:
        if len(req.metadata) > MAX_METADATA_PAIRS:
            raise InvalidRequest(f"metadata holds at most {MAX_METADATA_PAIRS} pairs", param="metadata")
        for key, value in req.metadata.items():
            if len(key) > 64 or len(value) > 512:
                raise InvalidRequest(
                    "metadata keys are at most 64 characters and values at most 512", param="metadata"
                )
    for name in ("user", "safety_identifier", "prompt_cache_key"):
        value = getattr(req, name)
        if value is not None and len(value) > MAX_ID_CHARS:
            raise InvalidRequest(f"{name} is at most {MAX_ID_CHARS} characters", param=name)


def logit_bias(req: ChatCompletionRequest | CompletionRequest) -> tuple[tuple[int, float], ...]:
    """``logit_bias`` as (token id, bias) pairs; ids are checked against the vocabulary later."""
    if not req.logit_bias:
        return ()
    if len(req.logit_bias) > MAX_LOGIT_BIAS:
        raise InvalidRequest(f"logit_bias holds at most {MAX_LOGIT_BIAS} tokens", param="logit_bias")
    pairs = []
    for key, bias in req.logit_bias.items():
        if _TOKEN_ID.fullmatch(key) is None or int(key) > MAX_INT32:
            raise InvalidRequest(f"logit_bias keys must be token ids (got {key!r})", param="logit_bias")
        if not -100.0 <= bias <= 100.0:
            raise InvalidRequest("logit_bias values must be between -100 and 100", param="logit_bias")
        pairs.append((int(key), float(bias)))
    return tuple(pairs)


def _check_choice(value: str | None, allowed: tuple[str, ...], name: str, why: str) -> None:
    if value is not None and value not in allowed:
        shown = " or ".join(repr(a) for a in allowed)
        raise InvalidRequest(f"{name} must be {shown} or absent: {why}", param=name)


def _check_message(message: ChatMessage, index: int) -> None:
    if message.role not in _ROLES:
        raise InvalidRequest(
            f"message {index}: role must be one of {', '.join(_ROLES)} (got {message.role!r})",
            param=f"messages[{index}].role",
        )
    if message.tool_calls and message.role != "assistant":
        raise InvalidRequest(
            f"message {index}: only assistant messages carry tool_calls",
            param=f"messages[{index}].tool_calls",
        )
    if (message.role == "tool") != (message.tool_call_id is not None):
        raise InvalidRequest(
            f"message {index}: a tool message needs tool_call_id, and only a tool message has one",
            param=f"messages[{index}].tool_call_id",
        )
    _content_text(message.content, index)  # refuses non-text parts now, not at templating


def _message_dict(message: ChatMessage, index: int) -> dict[str, Any]:
    text = _content_text(message.content, index)
    if not text and message.refusal:  # an assistant's earlier refusal is what it said
        text = message.refusal
    role = "system" if message.role == "developer" else message.role  # OpenAI's newer name for it
    out: dict[str, Any] = {"role": role, "content": text}
    if message.name is not None:
        out["name"] = message.name
    if message.tool_calls:
        out["tool_calls"] = [msgspec.to_builtins(call) for call in message.tool_calls]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    return out


def tool_spec(req: ChatCompletionRequest) -> ToolSpec:
    """The request's tools and tool_choice, validated (``InvalidRequest`` naming the field)."""
    return parse_tool_spec(req.tools, req.tool_choice)


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
        if part.type == "refusal" and part.refusal is not None:
            texts.append(part.refusal)
            continue
        if part.type != "text" or part.text is None:
            raise InvalidRequest(
                f"message {index}: only text content parts are supported (got {part.type!r})",
                param=f"messages[{index}].content",
            )
        texts.append(part.text)
    return "".join(texts)
