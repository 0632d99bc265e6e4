"""OpenAI's Responses API (``POST /v1/responses``) on top of the chat pipeline.

A Responses request is turned into the chat request it means (``to_chat``): ``instructions`` a
system message, ``input`` (a string, or items: messages, ``function_call`` and
``function_call_output``) the messages, Responses-style function tools the chat ones, ``text.format``
the ``response_format``, ``max_output_tokens`` the ``max_completion_tokens``. The chat parser
then checks it all, so both endpoints accept and refuse the same things. The output comes back
as Responses items: a ``message`` with ``output_text``, then a ``function_call`` per call; streamed
as OpenAI's events (``response.created`` ... ``response.completed``), each with its
``sequence_number``.

``previous_response_id`` continues a stored response: its whole conversation (input and output)
comes before the new input. Responses are stored unless ``store`` is false, in this frontend's
memory only (``ResponseStore``: the newest first, within a budget of characters; another frontend
or a restart does not have them), and can be read back (``GET /v1/responses/{id}``) or deleted.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import msgspec

from interlock.errors import InvalidRequest
from interlock.frontend.assembler import Delta, OutputAssembler
from interlock.frontend.limits import DEFAULT_MAX_JSON_DEPTH, check_depth
from interlock.frontend.schemas import ChatCompletionRequest, decode_body, parse_chat
from interlock.frontend.tool_parsers import ToolCallDelta, ToolStreamParser
from interlock.protocol import TokenLogprobs

STORE_CHARS = 32 * 1024 * 1024
"""What the store keeps at most, in characters of stored conversation (oldest dropped first)."""
_encode = msgspec.json.Encoder().encode


class TextFormat(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    type: str
    name: str | None = None
    schema: Any = None
    strict: bool | None = None
    description: str | None = None


class TextConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    format: TextFormat | None = None
    verbosity: str | None = None


class Reasoning(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    effort: str | None = None
    summary: str | None = None


class ResponsesRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    model: str
    input: str | list[Any]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    stream: bool = False
    store: bool | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    service_tier: str | None = None
    previous_response_id: str | None = None
    reasoning: Reasoning | None = None
    truncation: str | None = None
    include: list[str] | None = None
    background: bool | None = None
    max_tool_calls: int | None = None


_decoder = msgspec.json.Decoder(ResponsesRequest)
# Chat fields named differently here, for errors about them.
_PARAMS = {
    "messages": "input",
    "max_completion_tokens": "max_output_tokens",
    "response_format": "text.format",
}


def parse_responses(body: bytes, *, max_depth: int = DEFAULT_MAX_JSON_DEPTH) -> ResponsesRequest:
    req: ResponsesRequest = decode_body(_decoder, ResponsesRequest, body, max_depth)
    for name in ("input", "tools", "tool_choice"):
        check_depth(getattr(req, name), max_depth, param=name)
    if req.text is not None and req.text.format is not None:
        check_depth(req.text.format.schema, max_depth, param="text.format.schema")
    if req.truncation not in (None, "disabled"):
        raise InvalidRequest('truncation must be "disabled": the input is never cut', param="truncation")
    if req.include:
        raise InvalidRequest("include is not supported (no extra output is kept)", param="include")
    if req.background:
        raise InvalidRequest(
            "background is not supported: responses run while the request is open", param="background"
        )
    if req.reasoning is not None and req.reasoning.effort not in (None, "none"):
        raise InvalidRequest("reasoning is not supported: the model does not reason", param="reasoning")
    if req.reasoning is not None and req.reasoning.summary is not None:
        raise InvalidRequest("reasoning.summary is not supported", param="reasoning.summary")
    if req.max_output_tokens is not None and req.max_output_tokens < 1:
        raise InvalidRequest("max_output_tokens must be at least 1", param="max_output_tokens")
    if req.max_tool_calls is not None and req.max_tool_calls < 1:
        raise InvalidRequest("max_tool_calls must be at least 1", param="max_tool_calls")
    if req.text is not None and req.text.verbosity not in (None, "medium"):
        raise InvalidRequest('text.verbosity must be "medium" (the model has one)', param="text.verbosity")
    return req


def to_chat(req: ResponsesRequest, history: Sequence[dict[str, Any]] = ()) -> ChatCompletionRequest:
    """The chat request ``req`` means, after ``history`` (a stored conversation's messages)."""
    messages: list[dict[str, Any]] = []
    if req.instructions:
        messages.append({"role": "system", "content": req.instructions})
    messages.extend(history)
    messages.extend(input_messages(req.input))
    body: dict[str, Any] = {"model": req.model, "messages": messages, "store": False, "stream": req.stream}
    for name in ("temperature", "top_p", "parallel_tool_calls", "metadata", "user", "safety_identifier"):
        if getattr(req, name) is not None:
            body[name] = getattr(req, name)
    for name in ("prompt_cache_key", "service_tier"):
        if getattr(req, name) is not None:
            body[name] = getattr(req, name)
    if req.max_output_tokens is not None:
        body["max_completion_tokens"] = req.max_output_tokens
    if req.tools is not None:
        body["tools"] = [_chat_tool(t, i) for i, t in enumerate(req.tools)]
    if req.tool_choice is not None:
        body["tool_choice"] = _chat_tool_choice(req.tool_choice)
    if req.text is not None and req.text.format is not None:
        body["response_format"] = _response_format(req.text.format)
    try:
        return parse_chat(_encode(body))
    except InvalidRequest as exc:
        head = (exc.param or "").split(".")[0].split("[")[0]
        if head in _PARAMS:
            exc.param = _PARAMS[head] + (exc.param or "")[len(head) :]
        raise


def input_messages(value: str | list[Any]) -> list[dict[str, Any]]:
    """Chat messages from a Responses ``input``: a string, or a list of input items."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise InvalidRequest(f"input[{i}] must be an object", param=f"input[{i}]")
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(_message(item, i))
        elif kind == "function_call":
            call = {
                "id": _string(item, "call_id", i),
                "type": "function",
                "function": {"name": _string(item, "name", i), "arguments": _string(item, "arguments", i)},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else json.dumps(output)
            messages.append({"role": "tool", "tool_call_id": _string(item, "call_id", i), "content": text})
        else:
            raise InvalidRequest(
                f"input[{i}]: items of type {kind!r} are not supported (message, function_call, "
                "function_call_output)",
                param=f"input[{i}].type",
            )
    return messages


def _message(item: dict[str, Any], i: int) -> dict[str, Any]:
    unknown = set(item) - {"type", "role", "content", "id", "status"}
    if unknown:
        raise InvalidRequest(f"input[{i}]: unknown field {sorted(unknown)[0]!r}", param=f"input[{i}]")
    content = item.get("content")
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text", "text"):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise InvalidRequest(
                    f"input[{i}].content[{j}]: only text parts are supported (got {kind!r})",
                    param=f"input[{i}].content[{j}]",
                )
            texts.append(str(part.get("text", "")))
        content = "".join(texts)
    elif not isinstance(content, str):
        raise InvalidRequest(
            f"input[{i}].content must be a string or a list of parts", param=f"input[{i}].content"
        )
    return {"role": item.get("role"), "content": content}


def _string(item: dict[str, Any], key: str, i: int) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise InvalidRequest(f"input[{i}].{key} must be a string", param=f"input[{i}].{key}")
    return value


def _chat_tool(tool: Any, i: int) -> dict[str, Any]:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else None
        raise InvalidRequest(
            f"tools[{i}]: only function tools are supported (got {kind!r})", param=f"tools[{i}].type"
        )
    function = {k: v for k, v in tool.items() if k != "type"}
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def _response_format(fmt: TextFormat) -> dict[str, Any]:
    if fmt.type != "json_schema":
        return {"type": fmt.type}
    schema = {"name": fmt.name or "output", "schema": fmt.schema, "strict": fmt.strict}
    if fmt.description is not None:
        schema["description"] = fmt.description
    return {"type": "json_schema", "json_schema": schema}


def new_response_id() -> str:
    return f"resp_{uuid.uuid4().hex}"


class ResponsesFormatter:
    """One response's output, as Responses items and events (the chat formatters' interface:
    ``chunk``, ``usage_chunk``, ``choice``, ``body``, ``index``)."""

    index = 0

    def __init__(
        self,
        response_id: str,
        model: str,
        req: ResponsesRequest,
        assembler: OutputAssembler,
        tool_calls: ToolStreamParser | None,
    ) -> None:
        self.response_id = response_id
        self.model = model
        self.req = req
        self.created = int(time.time())
        self._assembler = assembler
        self._tools = tool_calls
        self._seq = 0
        self._started = False
        self._message_id = f"msg_{uuid.uuid4().hex}"
        self._message_open = False
        self._text: list[str] = []
        self.output: list[dict[str, Any]] = []
        """The items done so far; at the end, the response's output."""
        self.status = "in_progress"
        self.final: dict[str, Any] | None = None
        """The whole response, once it has ended."""

    # ---- streaming ----
    def chunk(self, delta: Delta) -> bytes:
        events: list[dict[str, Any]] = []
        if not self._started:
            self._started = True
            events += [{"type": "response.created", "response": self._response()}]
            events += [{"type": "response.in_progress", "response": self._response()}]
        content, calls, finish = self._split(delta.text, delta.finish_reason)
        if content:
            events += self._open_message()
            self._text.append(content)
            at = {"item_id": self._message_id, "output_index": self._message_index, "content_index": 0}
            events.append({"type": "response.output_text.delta", **at, "delta": content, "logprobs": []})
        for call in calls:
            events += self._close_message()
            item = _call_item(call)
            at = {"output_index": len(self.output), "item_id": item["id"]}
            events.append(
                {
                    "type": "response.output_item.added",
                    "output_index": len(self.output),
                    "item": {**item, "status": "in_progress", "arguments": ""},
                }
            )
            events.append({"type": "response.function_call_arguments.delta", **at, "delta": call.arguments})
            events.append(
                {"type": "response.function_call_arguments.done", **at, "arguments": call.arguments}
            )
            events.append(
                {"type": "response.output_item.done", "output_index": len(self.output), "item": item}
            )
            self.output.append(item)
        if finish is not None:
            events += self._close_message()
            self.status = "incomplete" if finish == "length" else "completed"
            kind = "response.incomplete" if self.status == "incomplete" else "response.completed"
            self.final = self._response(self._usage())
            events.append({"type": kind, "response": self.final})
        return b"".join(self._event(e) for e in events)

    def usage_chunk(self, body: dict[str, Any]) -> bytes:
        return b""  # the usage is in the final event's response

    # ---- whole ----
    def choice(
        self,
        text: str,
        logprobs: Sequence[TokenLogprobs] | None,
        finish_reason: str | None,
        prompt_logprobs: Sequence[TokenLogprobs] | None = None,
    ) -> dict[str, Any]:
        """Records the output items of ``text`` (a Responses request asks for no logprobs)."""
        content, calls, finish = self._split(text, finish_reason)
        if content:
            self.output.append(_message_item(self._message_id, content))
        self.output.extend(_call_item(c) for c in calls)
        self.status = "incomplete" if finish == "length" else "completed"
        return {}

    def body(self, choices: list[dict[str, Any]], usage_body: dict[str, Any]) -> dict[str, Any]:
        self.final = self._response(_usage(usage_body))
        return self.final

    # ---- parts ----
    @property
    def _message_index(self) -> int:
        return len(self.output)

    def _open_message(self) -> list[dict[str, Any]]:
        if self._message_open:
            return []
        self._message_open = True
        at = {"output_index": self._message_index}
        item = {
            "id": self._message_id,
            "type": "message",
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        }
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return [
            {"type": "response.output_item.added", **at, "item": item},
            {
                "type": "response.content_part.added",
                **at,
                "item_id": self._message_id,
                "content_index": 0,
                "part": part,
            },
        ]

    def _close_message(self) -> list[dict[str, Any]]:
        if not self._message_open:
            return []
        self._message_open = False
        text = "".join(self._text)
        item = _message_item(self._message_id, text)
        at = {"item_id": self._message_id, "output_index": self._message_index, "content_index": 0}
        events = [
            {"type": "response.output_text.done", **at, "text": text, "logprobs": []},
            {"type": "response.content_part.done", **at, "part": item["content"][0]},
            {"type": "response.output_item.done", "output_index": self._message_index, "item": item},
        ]
        self.output.append(item)
        self._message_id = f"msg_{uuid.uuid4().hex}"  # text after a call is a new message
        self._text = []
        return events

    def _split(self, text: str, finish_reason: str | None) -> tuple[str, list[ToolCallDelta], str | None]:
        if self._tools is None:
            return text, [], finish_reason
        limit = 1 if self.req.parallel_tool_calls is False else self.req.max_tool_calls
        content, calls = self._tools.split(text, last=finish_reason is not None, max_calls=limit)
        return content, calls, finish_reason

    def _event(self, event: dict[str, Any]) -> bytes:
        event["sequence_number"] = self._seq
        self._seq += 1
        return b"event: " + event["type"].encode() + b"\ndata: " + _encode(event) + b"\n\n"

    def _usage(self) -> dict[str, Any]:
        a = self._assembler
        return {
            "input_tokens": a.prompt_tokens,
            "input_tokens_details": {"cached_tokens": a.cached_tokens},
            "output_tokens": a.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": a.total_tokens,
        }

    def _response(self, usage: dict[str, Any] | None = None) -> dict[str, Any]:
        req = self.req
        fmt = req.text.format if req.text is not None and req.text.format is not None else None
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created,
            "status": self.status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if self.status == "incomplete" else None,
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "max_tool_calls": req.max_tool_calls,
            "model": self.model,
            "output": list(self.output),
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": req.previous_response_id,
            "reasoning": {"effort": None, "summary": None},
            "store": req.store is not False,
            "temperature": req.temperature,
            "text": {"format": msgspec.to_builtins(fmt) if fmt is not None else {"type": "text"}},
            "tool_choice": req.tool_choice
            if req.tool_choice is not None
            else ("auto" if req.tools else "none"),
            "tools": list(req.tools or []),
            "top_p": req.top_p,
            "truncation": "disabled",
            "usage": usage,
            "user": req.user,
            "metadata": dict(req.metadata or {}),
        }


def _message_item(item_id: str, text: str) -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"id": item_id, "type": "message", "status": "completed", "role": "assistant", "content": [part]}


def _call_item(call: ToolCallDelta) -> dict[str, Any]:
    return {
        "id": f"fc_{uuid.uuid4().hex}",
        "type": "function_call",
        "status": "completed",
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments,
    }


def _usage(chat_usage: dict[str, Any]) -> dict[str, Any]:
    return {
        "input_tokens": chat_usage["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": chat_usage["prompt_tokens_details"]["cached_tokens"]},
        "output_tokens": chat_usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": chat_usage["total_tokens"],
    }


class ResponseStore:
    """Finished responses by id, for ``previous_response_id`` and ``GET /v1/responses/{id}``:
    each with the conversation it ends (chat messages, its output included). Bounded by the
    characters it keeps: the least recently used go first."""

    def __init__(self, max_chars: int = STORE_CHARS) -> None:
        self.max_chars = max_chars
        self._entries: OrderedDict[str, tuple[dict[str, Any], list[dict[str, Any]], int]] = OrderedDict()
        self._chars = 0

    def put(self, response: dict[str, Any], conversation: list[dict[str, Any]]) -> None:
        size = len(_encode(conversation)) + len(_encode(response))
        if size > self.max_chars:
            return
        self.delete(response["id"])
        self._entries[response["id"]] = (response, conversation, size)
        self._chars += size
        while self._chars > self.max_chars:
            _, (_, _, dropped) = self._entries.popitem(last=False)
            self._chars -= dropped

    def get(self, response_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
        entry = self._entries.get(response_id)
        if entry is None:
            return None
        self._entries.move_to_end(response_id)
        return entry[0], entry[1]

    def delete(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is not None:
            self._chars -= entry[2]
        return entry is not None


def output_messages(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A response's output items as the chat messages a next turn continues from."""
    messages: list[dict[str, Any]] = []
    for item in output:
        if item["type"] == "message":
            text = "".join(part["text"] for part in item["content"])
            messages.append({"role": "assistant", "content": text})
        elif item["type"] == "function_call":
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            last = messages[-1] if messages else None
            if last is not None and last.get("tool_calls") is not None:
                last["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    return messages
