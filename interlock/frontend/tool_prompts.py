"""Tool calling, the prompt side: the tools offered in the text a model was trained on (for a
chat template that does not take ``tools``), and the tool history (assistant calls, tool
results) rewritten the way its family writes them. Pure; the types and the choice of format are
``tools``, the parsing of calls out of the output ``tool_parsers``."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from interlock.errors import InvalidRequest
from interlock.frontend.tools import (
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    ToolChoice,
    ToolFormat,
    ToolSpec,
)


def template_tools(spec: ToolSpec) -> list[dict[str, Any]] | None:
    """The ``tools`` variable for a template that takes them (None when they are not offered)."""
    return [t.as_dict() for t in spec.tools] if spec.active else None


def messages_for_template(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages for a template that takes tools: the assistant calls' ``arguments`` decoded from
    OpenAI's JSON text to the object templates expect (transformers' convention: they ``tojson`` it)."""
    out = []
    for i, message in enumerate(messages):
        copy = dict(message)
        if message.get("role") == "assistant" and message.get("tool_calls"):
            copy["tool_calls"] = [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
                for call_id, name, args in _history_calls(message["tool_calls"], i)
            ]
        out.append(copy)
    return out


# ---- prompts (for a template that does not take tools) ----
# SmolLM2's function-calling system prompt, verbatim from its model card
# (HuggingFaceTB/SmolLM2-1.7B-Instruct, instructions_function_calling.md); {tools} is a JSON list.
_SMOLLM2_REQUIRED = (
    "You are an expert in composing functions. You are given a question and a set of possible functions. \n"
    "Based on the question, you will need to make one or more function/tool calls to achieve the purpose. \n"
    "If none of the functions can be used, point it out and refuse to answer. \n"
    "If the given question lacks the parameters required by the function, also point it out.\n\n"
    "You have access to the following tools:\n<tools>{tools}</tools>\n\n"
    "The output MUST strictly adhere to the following format, and NO other text MUST be included.\n"
    "The example format is as follows. Please make sure the parameter type is correct. "
    "If no function call is needed, please make the tool calls an empty list '[]'.\n"
    "<tool_call>[\n"
    '{"name": "func_name1", "arguments": {"argument1": "value1", "argument2": "value2"}},\n'
    "... (more tool calls as required)\n"
    "]</tool_call>"
)
# The same, adapted for tool_choice "auto": a plain answer is allowed.
_SMOLLM2_AUTO = (
    "You are an expert in composing functions. You are given a question and a set of possible functions. \n"
    "Based on the question, you may need to make one or more function/tool calls to achieve the purpose. \n"
    "If none of the functions is needed, answer the question normally. \n"
    "If the given question lacks the parameters required by the function, point it out.\n\n"
    "You have access to the following tools:\n<tools>{tools}</tools>\n\n"
    "To call functions, the output MUST strictly adhere to the following format, and NO other text MUST be included.\n"
    "The example format is as follows. Please make sure the parameter type is correct. "
    "If no function call is needed, answer normally, without <tool_call> tags.\n"
    "<tool_call>[\n"
    '{"name": "func_name1", "arguments": {"argument1": "value1", "argument2": "value2"}},\n'
    "... (more tool calls as required)\n"
    "]</tool_call>"
)
# Qwen2.5's template text (the Hermes format); {tools} is one JSON object a line.
_HERMES = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)
# Llama 3.1's template text (custom tools in the first user message); tools follow, indented JSON.
_LLAMA3 = (
    "Given the following functions, please respond with a JSON for a function call "
    "with its proper arguments that best answers the given prompt.\n\n"
    'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}. '
    "Do not use variables."
)


def tool_prompt(fmt: ToolFormat, spec: ToolSpec) -> str:
    """The tool list and instructions for ``spec.choice`` in the format's own words."""
    tools = [t.as_dict() for t in spec.tools]
    line = _choice_line(spec.choice)
    if fmt is ToolFormat.SMOLLM2:
        listing = json.dumps(tools, ensure_ascii=False)
        if spec.choice.mode == "auto":  # the adapted prompt says it already
            return _SMOLLM2_AUTO.replace("{tools}", listing)
        return _SMOLLM2_REQUIRED.replace("{tools}", listing) + "\n\n" + line
    if fmt is ToolFormat.HERMES:
        listing = "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools)
        return _HERMES.replace("{tools}", listing) + "\n\n" + line
    listing = "".join(json.dumps(t, indent=4, ensure_ascii=False) + "\n\n" for t in tools)
    return f"{_LLAMA3}\n{line}\n\n{listing}".rstrip()


def _choice_line(choice: ToolChoice) -> str:
    if choice.mode == "named":
        return f'You must call the function "{choice.name}".'
    if choice.mode == "required":
        return "You must call at least one of these functions."
    return "If no function call is needed, answer normally."


def render_tools(
    fmt: ToolFormat, messages: Sequence[Mapping[str, Any]], spec: ToolSpec
) -> list[dict[str, Any]]:
    """Plain ``{"role", "content"}`` messages for a template that does not take tools.

    The tool block goes where the family's own template puts it: after the system text for
    HERMES (Qwen2.5), before it for SMOLLM2 (its prompt is a whole system prompt), in the first
    user message before its text for LLAMA3_JSON (Llama 3.1's default). With no active tools only
    the history is rewritten.
    """
    plain = _rewrite_history(fmt, messages)
    if not spec.active:
        return plain
    block = tool_prompt(fmt, spec)
    if fmt is ToolFormat.LLAMA3_JSON:
        first_user = next((i for i, m in enumerate(plain) if m["role"] == "user"), None)
        if first_user is not None:
            plain[first_user]["content"] = _join(block, plain[first_user]["content"])
            return plain
    if plain and plain[0]["role"] == "system":
        existing = plain[0]["content"]
        plain[0]["content"] = _join(block, existing) if fmt is ToolFormat.SMOLLM2 else _join(existing, block)
        return plain
    return [{"role": "system", "content": block}, *plain]


def _join(first: str, second: str) -> str:
    return f"{first}\n\n{second}" if first and second else first or second


def _rewrite_history(fmt: ToolFormat, messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    previous_role = None
    for i, message in enumerate(messages):
        role = message.get("role")
        content = _text(message.get("content"), f"messages[{i}].content")
        if role == "tool" and fmt is ToolFormat.LLAMA3_JSON:
            out.append({"role": "ipython", "content": content})
        elif role == "tool":  # one user turn holds consecutive results, as Qwen2.5's template does
            response = f"<tool_response>\n{content}\n</tool_response>"
            if previous_role == "tool":
                out[-1]["content"] += "\n" + response
            else:
                out.append({"role": "user", "content": response})
        elif role == "assistant" and message.get("tool_calls"):
            calls = [(name, args) for _, name, args in _history_calls(message["tool_calls"], i)]
            out.append({"role": "assistant", "content": _join_lines(content, _calls_text(fmt, calls))})
        else:
            out.append({"role": role, "content": content})
        previous_role = role
    return out


def _join_lines(first: str, second: str) -> str:
    return f"{first}\n{second}" if first else second


def _calls_text(fmt: ToolFormat, calls: list[tuple[str, dict[str, Any]]]) -> str:
    """Calls as the model itself would have written them."""
    if fmt is ToolFormat.LLAMA3_JSON:
        return "; ".join(json.dumps({"name": n, "parameters": a}, ensure_ascii=False) for n, a in calls)
    bodies = [json.dumps({"name": n, "arguments": a}, ensure_ascii=False) for n, a in calls]
    if fmt is ToolFormat.SMOLLM2:
        return TOOL_CALL_OPEN + "[\n" + ",\n".join(bodies) + "\n]" + TOOL_CALL_CLOSE
    return "\n".join(f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}" for body in bodies)


def _text(content: object, at: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(
        isinstance(p, Mapping) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content
    ):
        return "".join(p["text"] for p in content)
    raise InvalidRequest(f"{at} must be text", param=at)


def _history_calls(raw: object, index: int) -> list[tuple[str, str, dict[str, Any]]]:
    """An assistant message's ``tool_calls`` as (id, name, arguments object)."""
    at = f"messages[{index}].tool_calls"
    if not isinstance(raw, list):
        raise InvalidRequest(f"{at} must be a list", param=at)
    calls = []
    for j, call in enumerate(raw):
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise InvalidRequest(f"{at}[{j}] must be a function call with a name", param=f"{at}[{j}]")
        arguments = fn.get("arguments")
        try:
            decoded = json.loads(arguments) if isinstance(arguments, str) else None
        except ValueError:
            decoded = None
        if not isinstance(decoded, dict):
            raise InvalidRequest(
                f"{at}[{j}].function.arguments must be the JSON text of an object",
                param=f"{at}[{j}].function.arguments",
            )
        calls.append((str(call.get("id", "")), fn["name"], decoded))
    return calls
