"""Tool calls out of a model's text: whole (``parse_tool_calls``) or streamed (``ToolStreamParser``).

A call is all or nothing. A tagged block ``<tool_call>BODY</tool_call>`` is calls when BODY is
one call object or a JSON list of them (``[]``: no calls) and every call names an offered tool;
then the block leaves the content. Otherwise the block, tags and all, stays content, never half
parsed. A block left open at the end of the text counts if its body alone is complete. A call
object is ``{"name": str, "arguments": {...}}`` (``"parameters"`` instead for LLAMA3_JSON, which
also takes ``"arguments"``); no other keys; missing arguments are ``{}``. For LLAMA3_JSON the
whole reply is calls or content: a reply that starts with ``{`` or ``<|python_tag|>`` and is
nothing but call objects joined by ``;``.

The content is what is left, stripped. The stream parser gives exactly what ``parse_tool_calls``
gives for the whole text, however the text is split: it holds back what may still turn into
markup (a possible start of ``<tool_call>``, an open block, a whole LLAMA3_JSON reply that
starts like a call) and trailing whitespace (the content is stripped); each call goes out whole,
in one delta, when its block closes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from interlock.frontend.tools import (
    PYTHON_TAG,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    FunctionTool,
    ToolCall,
    ToolFormat,
    constrained_prefix,
    new_call_id,
)

_Call = tuple[str, str]  # (name, compact arguments), before it is given an id


@dataclass(frozen=True)
class ContentDelta:
    text: str


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of call ``index``: ``id`` and ``name`` on its first piece, then None."""

    index: int
    id: str | None
    name: str | None
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        """The entry of a chunk's ``delta.tool_calls``."""
        if self.id is None:
            return {"index": self.index, "function": {"arguments": self.arguments}}
        function = {"name": self.name, "arguments": self.arguments}
        return {"index": self.index, "id": self.id, "type": "function", "function": function}


Delta = ContentDelta | ToolCallDelta


def parse_tool_calls(
    fmt: ToolFormat, text: str, tools: Sequence[FunctionTool], *, make_id: Callable[[], str] = new_call_id
) -> tuple[str, list[ToolCall]]:
    """A complete output split into its content (markup removed, stripped) and its calls."""
    names = frozenset(t.name for t in tools)
    if fmt is ToolFormat.LLAMA3_JSON:
        calls = _llama_calls(text, names) if _llama_candidate(text) else None
        return ("", _with_ids(calls, make_id)) if calls is not None else (text.strip(), [])
    content: list[str] = []
    found: list[_Call] = []
    pos = 0
    while (start := text.find(TOOL_CALL_OPEN, pos)) >= 0:
        content.append(text[pos:start])
        body_at = start + len(TOOL_CALL_OPEN)
        end = text.find(TOOL_CALL_CLOSE, body_at)
        body = text[body_at:] if end < 0 else text[body_at:end]
        calls = _block_calls(body, names)
        if calls is None:
            content.append(text[start:] if end < 0 else text[start : end + len(TOOL_CALL_CLOSE)])
        else:
            found.extend(calls)
        pos = len(text) if end < 0 else end + len(TOOL_CALL_CLOSE)
    content.append(text[pos:])
    return "".join(content).strip(), _with_ids(found, make_id)


def parse_constrained(
    fmt: ToolFormat, body: str, tools: Sequence[FunctionTool], *, make_id: Callable[[], str] = new_call_id
) -> tuple[str, list[ToolCall]]:
    """The output of a forced call (``required_schema``): its calls. A body the grammar did not
    finish (cut by max_tokens) is content, prefix included, as a ``ToolStreamParser`` fed the
    prefix first gives it."""
    return parse_tool_calls(fmt, (constrained_prefix(fmt) or "") + body, tools, make_id=make_id)


class ToolStreamParser:
    """Incremental ``parse_tool_calls``: ``feed`` each text delta, then ``finish`` once."""

    def __init__(
        self, fmt: ToolFormat, tools: Sequence[FunctionTool], *, make_id: Callable[[], str] = new_call_id
    ) -> None:
        self._fmt = fmt
        self._names = frozenset(t.name for t in tools)
        self._make_id = make_id
        self._buffer = ""  # text not yet decided
        self._in_block = False  # tagged: the buffer is the body of an open block
        self._scanned = 0  # tagged, in a block: how much of the buffer holds no closing tag
        self._mode = "undecided"  # LLAMA3_JSON: "undecided", "content" or "held"
        self._space = ""  # content whitespace held back: it may end the content
        self._started = False  # some content was emitted (leading whitespace is dropped)
        self._finished = False
        self.call_count = 0

    def feed(self, text: str) -> list[Delta]:
        assert not self._finished, "feed after finish"
        out: list[Delta] = []
        self._buffer += text
        if self._fmt is ToolFormat.LLAMA3_JSON:
            self._feed_llama(out)
        else:
            self._feed_tagged(out)
        return out

    def split(
        self, text: str, *, last: bool, max_calls: int | None = None
    ) -> tuple[str, list[ToolCallDelta]]:
        """``feed`` (then ``finish`` when ``last``), as the content text and the whole calls,
        the calls past ``max_calls`` dropped (``parallel_tool_calls: false``, ``max_tool_calls``)."""
        parts = self.feed(text)
        if last:
            parts += self.finish()
        content = "".join(p.text for p in parts if isinstance(p, ContentDelta))
        calls = [
            p for p in parts if isinstance(p, ToolCallDelta) and (max_calls is None or p.index < max_calls)
        ]
        return content, calls

    def finish(self) -> list[Delta]:
        assert not self._finished, "finish called twice"
        self._finished = True
        out: list[Delta] = []
        rest, self._buffer = self._buffer, ""
        if self._fmt is ToolFormat.LLAMA3_JSON and self._mode == "held":
            calls = _llama_calls(rest, self._names)
            self._emit_calls(calls, out) if calls is not None else self._emit_content(rest, out)
        elif self._in_block:
            calls = _block_calls(rest, self._names)
            self._emit_calls(calls, out) if calls is not None else self._emit_content(
                TOOL_CALL_OPEN + rest, out
            )
        else:
            self._emit_content(rest, out)
        return out  # the held-back trailing whitespace ends the content: dropped

    def _feed_tagged(self, out: list[Delta]) -> None:
        while True:
            if not self._in_block:
                start = self._buffer.find(TOOL_CALL_OPEN)
                if start < 0:  # keep what may be the start of a tag
                    keep = _partial_suffix(self._buffer, TOOL_CALL_OPEN)
                    self._emit_content(self._buffer[: len(self._buffer) - keep], out)
                    self._buffer = self._buffer[len(self._buffer) - keep :]
                    return
                self._emit_content(self._buffer[:start], out)
                self._buffer = self._buffer[start + len(TOOL_CALL_OPEN) :]
                self._in_block, self._scanned = True, 0
                continue
            end = self._buffer.find(TOOL_CALL_CLOSE, max(0, self._scanned - len(TOOL_CALL_CLOSE) + 1))
            if end < 0:
                self._scanned = len(self._buffer)
                return
            body = self._buffer[:end]
            calls = _block_calls(body, self._names)
            if calls is None:
                self._emit_content(TOOL_CALL_OPEN + body + TOOL_CALL_CLOSE, out)
            else:
                self._emit_calls(calls, out)
            self._buffer = self._buffer[end + len(TOOL_CALL_CLOSE) :]
            self._in_block = False

    def _feed_llama(self, out: list[Delta]) -> None:
        if self._mode == "undecided":
            head = self._buffer.lstrip()
            if not head or (PYTHON_TAG.startswith(head) and head != PYTHON_TAG):
                return
            self._mode = "held" if _llama_candidate(head) else "content"
        if self._mode == "content":
            self._emit_content(self._buffer, out)
            self._buffer = ""

    def _emit_content(self, text: str, out: list[Delta]) -> None:
        text = self._space + text
        if not self._started:
            text = text.lstrip()
        stripped = text.rstrip()
        self._space = text[len(stripped) :]
        if stripped:
            self._started = True
            out.append(ContentDelta(stripped))

    def _emit_calls(self, calls: Iterable[_Call], out: list[Delta]) -> None:
        for call in _with_ids(list(calls), self._make_id):
            out.append(ToolCallDelta(self.call_count, call.id, call.name, call.arguments))
            self.call_count += 1


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of ``text`` that begins ``tag``."""
    for k in range(min(len(text), len(tag) - 1), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


def _with_ids(calls: list[_Call] | None, make_id: Callable[[], str]) -> list[ToolCall]:
    return [ToolCall(make_id(), name, arguments) for name, arguments in calls or ()]


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # NaN and Infinity: Python's json takes them


_decoder = json.JSONDecoder(parse_constant=_reject_constant)


def _block_calls(body: str, names: frozenset[str]) -> list[_Call] | None:
    """The calls of a tagged block's body, or None if it is not wholly calls."""
    try:
        value = _decoder.decode(body)  # surrounding whitespace allowed
    except (ValueError, RecursionError):
        return None
    items = value if isinstance(value, list) else [value]
    calls = [_call(item, names, "arguments") for item in items]
    return None if any(c is None for c in calls) else [c for c in calls if c is not None]


def _llama_candidate(text: str) -> bool:
    head = text.lstrip()
    return head.startswith("{") or head.startswith(PYTHON_TAG)


def _llama_calls(text: str, names: frozenset[str]) -> list[_Call] | None:
    """A whole LLAMA3_JSON reply as calls: ``[<|python_tag|>] obj (; obj)* [;]``, or None."""
    text = text.strip()
    if text.startswith(PYTHON_TAG):
        text = text[len(PYTHON_TAG) :]
    calls: list[_Call] = []
    pos = _skip_space(text, 0)
    while True:
        try:
            value, pos = _decoder.raw_decode(text, pos)
        except (ValueError, RecursionError):
            return None
        call = _call(value, names, "parameters", "arguments")
        if call is None:
            return None
        calls.append(call)
        pos = _skip_space(text, pos)
        if pos < len(text) and text[pos] == ";":
            pos = _skip_space(text, pos + 1)
        elif pos < len(text):
            return None
        if pos == len(text):
            return calls


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _call(value: object, names: frozenset[str], *argument_keys: str) -> _Call | None:
    if not isinstance(value, dict) or not set(value) <= {"name", *argument_keys}:
        return None
    name = value.get("name")
    given = [value[k] for k in argument_keys if k in value]
    if not isinstance(name, str) or name not in names or len(given) > 1:
        return None
    arguments = given[0] if given else {}
    if not isinstance(arguments, dict):
        return None
    return name, json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
