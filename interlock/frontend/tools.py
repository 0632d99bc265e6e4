"""Tool calling for chat completions: tool definitions and their validation, the call formats
models are trained on, and the schema of a forced call. Pure: no I/O; the prompt text and the tool history's rewriting are in
``tool_prompts``, the output side (parsing calls out of text) in ``tool_parsers``.

The frontend, not the engine, does tool calling, so it works for every engine behind Interlock:
the tools go into the prompt as text and calls come back as text in the model's own format.

Contract, per request:

1. ``spec = parse_tool_spec(body.tools, body.tool_choice)``: validated (``InvalidRequest`` naming
   the field, e.g. ``tools[1].function.name``), ``tool_choice`` normalised to a ``ToolChoice``.
2. ``fmt = tool_format_for(model_name, template_source)``, once per model.
3. The prompt. If ``template_takes_tools(source)`` the model's template renders tools itself:
   pass it ``tools=template_tools(spec)`` and ``messages_for_template(messages)``. Otherwise
   render it with ``render_tools(fmt, messages, spec)``: plain role/content messages with the
   tool list and instructions merged in, and the tool history (assistant ``tool_calls``, ``tool``
   results) rewritten as the text the family expects. Both are no-ops on plain messages.
4. The output. ``spec.constrained`` (required, or a named function): ``call = required_schema(
   fmt, spec)``; append ``call.prefix`` (if any) to the rendered prompt, have the engine generate
   JSON that matches ``call.schema``, and read the output with ``parse_constrained`` (or stream it
   through a ``ToolStreamParser`` fed ``call.prefix`` first). Otherwise, with ``spec.active``,
   ``parse_tool_calls`` / ``ToolStreamParser``; with no active tools the text is plain content.
"""

from __future__ import annotations

import re
import secrets
import string
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal, NamedTuple

from interlock.errors import InvalidRequest

MAX_TOOLS = 128
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_ID_ALPHABET = string.ascii_letters + string.digits
_TOOL_KEYS = frozenset({"type", "function"})
_FUNCTION_KEYS = frozenset({"name", "description", "parameters", "strict"})


# ---- types ----
@dataclass(frozen=True)
class FunctionTool:
    """One ``{"type": "function", "function": {...}}`` tool; ``parameters`` is a JSON schema of
    type object (None: no parameters). ``strict`` is kept as sent: prompts cannot promise it."""

    name: str
    description: str | None = None
    parameters: Mapping[str, Any] | None = None
    strict: bool | None = None

    def as_dict(self) -> dict[str, Any]:
        """The tool as a prompt or a chat template shows it (``strict`` is no business of the model)."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        if self.parameters is not None:
            function["parameters"] = self.parameters
        return {"type": "function", "function": function}

    def arguments_schema(self) -> dict[str, Any]:
        """The JSON schema a call's arguments must match: always an object."""
        return {"type": "object", **(self.parameters or {})}


@dataclass(frozen=True)
class ToolCall:
    """A parsed call. ``arguments`` is the compact JSON text of an object, as OpenAI returns it."""

    id: str
    name: str
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True)
class ToolChoice:
    mode: Literal["none", "auto", "required", "named"]
    name: str | None = None
    """The function a "named" choice forces."""


@dataclass(frozen=True)
class ToolSpec:
    tools: tuple[FunctionTool, ...]
    choice: ToolChoice

    @property
    def active(self) -> bool:
        """The model is offered the tools (and its output is parsed for calls)."""
        return bool(self.tools) and self.choice.mode != "none"

    @property
    def constrained(self) -> bool:
        """A call is forced: the engine must enforce ``required_schema``."""
        return self.choice.mode in ("required", "named")


class ToolFormat(StrEnum):
    """The call format a model was trained on.

    HERMES: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one call per tag (Hermes,
    Qwen2.5, SmolLM3; the default). SMOLLM2: the same tags, its card's prompt asks for a JSON list
    of calls in one tag. Both parse both shapes. LLAMA3_JSON: a bare ``{"name": ..., "parameters":
    {...}}``, optionally after ``<|python_tag|>``, several joined by ``;`` (Llama 3.1 / 3.2).
    """

    HERMES = "hermes"
    SMOLLM2 = "smollm2"
    LLAMA3_JSON = "llama3_json"


class ConstrainedCall(NamedTuple):
    prefix: str | None
    """Text to append to the rendered prompt (after the generation prompt) before the engine
    generates; its output is then the JSON body alone. None: the output starts at the body."""
    schema: dict[str, Any]
    """The JSON schema the generated body must match."""


def new_call_id() -> str:
    """An OpenAI-style call id: "call_" and 24 random letters and digits."""
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


# ---- validation ----
def parse_tool_spec(tools: object, tool_choice: object) -> ToolSpec:
    """The request's ``tools`` and ``tool_choice``, validated as OpenAI does; ``InvalidRequest``
    names the offending field. An absent choice is "auto" with tools, "none" without."""
    parsed = _parse_tools(tools)
    return ToolSpec(parsed, _parse_choice(tool_choice, parsed))


def _parse_tools(tools: object) -> tuple[FunctionTool, ...]:
    if tools is None:
        return ()
    if not isinstance(tools, list):
        raise InvalidRequest("tools must be a list of tools", param="tools")
    if len(tools) > MAX_TOOLS:
        raise InvalidRequest(f"at most {MAX_TOOLS} tools are supported (got {len(tools)})", param="tools")
    parsed: list[FunctionTool] = []
    for i, raw in enumerate(tools):
        tool = _parse_tool(raw, f"tools[{i}]")
        if any(t.name == tool.name for t in parsed):
            raise InvalidRequest(f"duplicate function name {tool.name!r}", param=f"tools[{i}].function.name")
        parsed.append(tool)
    return tuple(parsed)


def _parse_tool(raw: object, at: str) -> FunctionTool:
    tool = _object(raw, at, _TOOL_KEYS)
    if tool.get("type") != "function":
        raise InvalidRequest(f'{at}.type must be "function"', param=f"{at}.type")
    fn = _object(tool.get("function"), f"{at}.function", _FUNCTION_KEYS)
    name = fn.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidRequest(
            f"{at}.function.name must be 1 to 64 letters, digits, underscores or dashes",
            param=f"{at}.function.name",
        )
    description, parameters, strict = fn.get("description"), fn.get("parameters"), fn.get("strict")
    if description is not None and not isinstance(description, str):
        raise InvalidRequest(
            f"{at}.function.description must be a string", param=f"{at}.function.description"
        )
    if parameters is not None:
        _check_parameters(parameters, f"{at}.function.parameters")
    if strict is not None and not isinstance(strict, bool):
        raise InvalidRequest(f"{at}.function.strict must be a boolean", param=f"{at}.function.strict")
    return FunctionTool(name, description, parameters, strict)


def _object(raw: object, at: str, keys: frozenset[str]) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise InvalidRequest(f"{at} must be an object", param=at)
    unknown = sorted(set(raw) - keys)
    if unknown:
        raise InvalidRequest(f"unknown field {at}.{unknown[0]}", param=f"{at}.{unknown[0]}")
    return raw


def _check_parameters(schema: object, at: str) -> None:
    if (
        not isinstance(schema, dict)
        or schema.get("type", "object") != "object"
        or not isinstance(schema.get("properties", {}), dict)
        or not _strings(schema.get("required", []))
    ):
        raise InvalidRequest(f'{at} must be a JSON schema of type "object"', param=at)


def _strings(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _parse_choice(raw: object, tools: tuple[FunctionTool, ...]) -> ToolChoice:
    if raw is None or (raw == "auto" and not tools):
        return ToolChoice("auto" if tools else "none")
    if raw == "none":
        return ToolChoice("none")
    if raw in ("auto", "required"):
        choice = ToolChoice("auto" if raw == "auto" else "required")
    elif (
        isinstance(raw, dict)
        and raw.keys() == {"type", "function"}
        and raw["type"] == "function"
        and isinstance(raw["function"], dict)
        and raw["function"].keys() == {"name"}
        and isinstance(raw["function"]["name"], str)
    ):
        choice = ToolChoice("named", raw["function"]["name"])
    else:
        raise InvalidRequest(
            'tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}',
            param="tool_choice",
        )
    if not tools:
        raise InvalidRequest("tool_choice requires tools", param="tool_choice")
    if choice.mode == "named" and all(t.name != choice.name for t in tools):
        raise InvalidRequest(
            f"tool_choice names function {choice.name!r}, which is not in tools",
            param="tool_choice.function.name",
        )
    return choice


# ---- which format ----
def tool_format_for(model_name: str, chat_template_source: str | None) -> ToolFormat:
    """The call format of a model: by what its template shows, then by its name; HERMES if
    neither says (the most common format among open models)."""
    source, name = chat_template_source or "", model_name.lower()
    if TOOL_CALL_OPEN in source:
        return ToolFormat.HERMES
    if PYTHON_TAG in source or "<|start_header_id|>" in source:
        return ToolFormat.LLAMA3_JSON
    if "SmolLM" in source or "smollm2" in name:
        return ToolFormat.SMOLLM2
    if re.search(r"llama-?3", name):
        return ToolFormat.LLAMA3_JSON
    return ToolFormat.HERMES


def template_takes_tools(chat_template_source: str | None) -> bool:
    """Whether the model's own template renders a ``tools`` variable (Qwen2.5's, Llama 3.1's): then
    the caller passes ``tools=`` to it instead of ``render_tools``. A template only mentioning the
    word in its text would be taken as taking them; none known does."""
    return bool(chat_template_source and re.search(r"\btools\b", chat_template_source))


# ---- forced calls ----
def required_schema(fmt: ToolFormat, spec: ToolSpec) -> ConstrainedCall:
    """How to force a call (tool_choice "required" or a named function) with a JSON-schema grammar.

    The prompt is framed so the output is the call body alone: for the tagged formats the prefix
    opens the tag (the body's closing tag is then optional: the parser takes a complete body at
    the end of the text). The body is one call object ``{"name": const, "arguments": schema}``
    (``"parameters"`` for LLAMA3_JSON, as Llama writes it); "required" is an ``anyOf`` over the
    tools, except for SMOLLM2, whose trained shape is a list of calls in one tag: there it is an
    array of such objects with at least one item, so parallel calls stay possible.
    """
    assert spec.constrained, "required_schema is for tool_choice required or named"
    key = "parameters" if fmt is ToolFormat.LLAMA3_JSON else "arguments"
    if spec.choice.mode == "named":
        tool = next(t for t in spec.tools if t.name == spec.choice.name)
        return ConstrainedCall(constrained_prefix(fmt), _call_schema(tool, key))
    branches = [_call_schema(t, key) for t in spec.tools]
    one = branches[0] if len(branches) == 1 else {"anyOf": branches}
    if fmt is ToolFormat.SMOLLM2:
        return ConstrainedCall(constrained_prefix(fmt), {"type": "array", "items": one, "minItems": 1})
    return ConstrainedCall(constrained_prefix(fmt), one)


def constrained_prefix(fmt: ToolFormat) -> str | None:
    """``required_schema(...).prefix``: it depends on the format alone."""
    # Qwen2.5 writes a newline after the tag; SmolLM2's list starts right after it.
    return {ToolFormat.HERMES: TOOL_CALL_OPEN + "\n", ToolFormat.SMOLLM2: TOOL_CALL_OPEN}.get(fmt)


def _call_schema(tool: FunctionTool, key: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"const": tool.name}, key: tool.arguments_schema()},
        "required": ["name", key],
        "additionalProperties": False,
    }
