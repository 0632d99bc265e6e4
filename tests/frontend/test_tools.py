"""Tool calling, the pure part: validation, prompts, parsing (whole and streamed), forced calls."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from interlock.errors import InvalidRequest
from interlock.frontend.templates import ChatTemplate, load_chat_template_source
from interlock.frontend.tool_parsers import (
    ContentDelta,
    Delta,
    ToolCallDelta,
    ToolStreamParser,
    parse_constrained,
    parse_tool_calls,
)
from interlock.frontend.tool_prompts import messages_for_template, render_tools, template_tools, tool_prompt
from interlock.frontend.tools import (
    MAX_TOOLS,
    FunctionTool,
    ToolCall,
    ToolChoice,
    ToolFormat,
    ToolSpec,
    new_call_id,
    parse_tool_spec,
    required_schema,
    template_takes_tools,
    tool_format_for,
)

WEATHER_PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
    "required": ["city"],
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": WEATHER_PARAMS,
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}
SPEC = parse_tool_spec([WEATHER, TIME], None)
TOOLS = SPEC.tools
HERMES, SMOLLM2, LLAMA = ToolFormat.HERMES, ToolFormat.SMOLLM2, ToolFormat.LLAMA3_JSON


def ids() -> Callable[[], str]:
    counter = itertools.count()
    return lambda: f"call_{next(counter):024d}"


def call(index: int, name: str, arguments: str) -> ToolCall:
    return ToolCall(f"call_{index:024d}", name, arguments)


# ---- validation ----
def _error(tools: object, choice: object = None) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        parse_tool_spec(tools, choice)
    return info.value


@pytest.mark.parametrize(
    ("tools", "param"),
    [
        ("get_weather", "tools"),
        ([TIME] * (MAX_TOOLS + 1), "tools"),
        ([TIME, "x"], "tools[1]"),
        ([TIME, {"type": "retrieval", "function": TIME["function"]}], "tools[1].type"),
        ([TIME, {"type": "function"}], "tools[1].function"),
        ([TIME, {"type": "function", "function": {"name": "a b"}}], "tools[1].function.name"),
        ([TIME, {"type": "function", "function": {"name": "x" * 65}}], "tools[1].function.name"),
        ([TIME, {"type": "function", "function": {}}], "tools[1].function.name"),
        ([TIME, TIME], "tools[1].function.name"),
        (
            [TIME, {"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}],
            "tools[1].function.parameters",
        ),
        (
            [TIME, {"type": "function", "function": {"name": "f", "parameters": []}}],
            "tools[1].function.parameters",
        ),
        (
            [TIME, {"type": "function", "function": {"name": "f", "parameters": {"required": "x"}}}],
            "tools[1].function.parameters",
        ),
        (
            [TIME, {"type": "function", "function": {"name": "f", "description": 3}}],
            "tools[1].function.description",
        ),
        (
            [TIME, {"type": "function", "function": {"name": "f", "strict": "yes"}}],
            "tools[1].function.strict",
        ),
        ([TIME, {"type": "function", "function": {"name": "f", "params": {}}}], "tools[1].function.params"),
        ([{**TIME, "extra": 1}], "tools[0].extra"),
    ],
)
def test_invalid_tools_name_the_param(tools: object, param: str) -> None:
    assert _error(tools).param == param


@pytest.mark.parametrize(
    ("tools", "choice", "param"),
    [
        ([TIME], "sometimes", "tool_choice"),
        ([TIME], {"type": "function", "function": {"name": "get_weather"}}, "tool_choice.function.name"),
        ([TIME], {"type": "function", "name": "get_time"}, "tool_choice"),
        (None, "required", "tool_choice"),
        ([], {"type": "function", "function": {"name": "get_time"}}, "tool_choice"),
    ],
)
def test_invalid_tool_choice_names_the_param(tools: object, choice: object, param: str) -> None:
    assert _error(tools, choice).param == param


def test_tool_choice_is_normalised() -> None:
    assert parse_tool_spec(None, None) == ToolSpec((), ToolChoice("none"))
    assert parse_tool_spec([], "auto").choice == ToolChoice("none")
    assert SPEC.choice == ToolChoice("auto") and SPEC.active and not SPEC.constrained
    assert parse_tool_spec([TIME], "none").active is False
    assert parse_tool_spec([TIME], "required").constrained
    named = parse_tool_spec([WEATHER, TIME], {"type": "function", "function": {"name": "get_time"}})
    assert named.choice == ToolChoice("named", "get_time") and named.constrained
    assert TOOLS[0] == FunctionTool("get_weather", "The weather in a city.", WEATHER_PARAMS, None)
    assert TOOLS[0].as_dict() == WEATHER and TOOLS[1].as_dict() == TIME


def test_call_ids_are_openai_shaped() -> None:
    one, two = new_call_id(), new_call_id()
    assert one != two and one.startswith("call_") and len(one) == 29 and one[5:].isalnum()


# ---- formats ----
def test_format_by_template_then_name(smol_path: Path) -> None:
    smol_source = load_chat_template_source(
        smol_path, json.loads((smol_path / "tokenizer_config.json").read_text())
    )
    assert tool_format_for("smol", smol_source) is SMOLLM2
    assert not template_takes_tools(smol_source)
    qwen = "{%- if tools %}{{- '<tool_call>' }}{% endif %}"
    assert tool_format_for("smol", qwen) is HERMES and template_takes_tools(qwen)
    llama = "{{- '<|start_header_id|>' }}{%- if tools is not none %}{% endif %}"
    assert tool_format_for("x", llama) is LLAMA and template_takes_tools(llama)
    assert tool_format_for("HuggingFaceTB/SmolLM2-360M-Instruct", None) is SMOLLM2
    assert tool_format_for("meta-llama/Llama-3.2-1B-Instruct", None) is LLAMA
    assert tool_format_for("some-model", "{{ messages }}") is HERMES
    assert not template_takes_tools(None)


# ---- render ----
HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "Weather in Paris and the time?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
            },
            {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
    {"role": "tool", "tool_call_id": "call_2", "content": "noon"},
]


def test_render_smollm2_prepends_its_prompt_to_the_system_message() -> None:
    out = render_tools(SMOLLM2, [{"role": "system", "content": "Be brief."}, *HISTORY], SPEC)
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    system = out[0]["content"]
    assert system.startswith("You are an expert in composing functions.")
    assert system.endswith("]</tool_call>\n\nBe brief.")
    assert "<tools>" + json.dumps([WEATHER, TIME]) + "</tools>" in system
    assert "answer normally" in system
    assert out[2]["content"] == (
        '<tool_call>[\n{"name": "get_weather", "arguments": {"city": "Paris"}},\n'
        '{"name": "get_time", "arguments": {}}\n]</tool_call>'
    )
    assert (
        out[3]["content"] == "<tool_response>\n18C\n</tool_response>\n<tool_response>\nnoon\n</tool_response>"
    )
    assert all(set(m) == {"role", "content"} for m in out)


def test_render_hermes_appends_qwen_text_to_a_new_system_message() -> None:
    required = parse_tool_spec([WEATHER, TIME], "required")
    out = render_tools(HERMES, HISTORY, required)
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    system = out[0]["content"]
    assert system.startswith("# Tools\n\nYou may call one or more functions")
    assert f"<tools>\n{json.dumps(WEATHER)}\n{json.dumps(TIME)}\n</tools>" in system
    assert system.endswith("You must call at least one of these functions.")
    assert out[2]["content"] == (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    )
    kept = render_tools(HERMES, [{"role": "system", "content": "Be brief."}, HISTORY[0]], required)
    assert kept[0]["content"].startswith("Be brief.\n\n# Tools")


def test_render_llama_puts_tools_in_the_first_user_message() -> None:
    named = parse_tool_spec([WEATHER, TIME], {"type": "function", "function": {"name": "get_weather"}})
    out = render_tools(LLAMA, [{"role": "system", "content": "Be brief."}, *HISTORY], named)
    assert [m["role"] for m in out] == ["system", "user", "assistant", "ipython", "ipython"]
    assert out[0]["content"] == "Be brief."
    user = out[1]["content"]
    assert user.startswith("Given the following functions, please respond with a JSON for a function call")
    assert 'You must call the function "get_weather".' in user
    assert json.dumps(WEATHER, indent=4) in user
    assert user.endswith("\n\nWeather in Paris and the time?")
    assert out[2]["content"] == (
        '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "parameters": {}}'
    )
    assert [m["content"] for m in out[3:]] == ["18C", "noon"]


def test_render_without_active_tools_only_rewrites_history() -> None:
    none = parse_tool_spec([WEATHER, TIME], "none")
    out = render_tools(HERMES, HISTORY, none)
    assert [m["role"] for m in out] == ["user", "assistant", "user"]
    plain = [{"role": "user", "content": "Hi"}]
    assert render_tools(SMOLLM2, plain, parse_tool_spec(None, None)) == plain


def test_render_refuses_bad_history() -> None:
    bad = [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}]
    with pytest.raises(InvalidRequest) as info:
        render_tools(HERMES, bad, SPEC)
    assert info.value.param == "messages[0].tool_calls[0].function.arguments"
    with pytest.raises(InvalidRequest) as info:
        render_tools(HERMES, [{"role": "tool", "content": 3}], SPEC)
    assert info.value.param == "messages[0].content"


def test_rendered_messages_go_through_smollm2s_own_template(smol_path: Path) -> None:
    config = json.loads((smol_path / "tokenizer_config.json").read_text())
    source = load_chat_template_source(smol_path, config)
    assert source is not None
    template = ChatTemplate(source, special_tokens={"bos_token": None, "eos_token": None})
    prompt = template.render(render_tools(SMOLLM2, HISTORY, SPEC))
    assert prompt.startswith("<|im_start|>system\nYou are an expert in composing functions.")
    assert "<|im_start|>user\n<tool_response>\n18C\n</tool_response>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


def test_template_path_decodes_arguments() -> None:
    out = messages_for_template(HISTORY)
    assert out[1]["tool_calls"][0] == {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
    }
    assert out[2] == HISTORY[2]
    assert template_tools(SPEC) == [WEATHER, TIME]
    assert template_tools(parse_tool_spec([TIME], "none")) is None


# ---- parse ----
W = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
T = '{"name": "get_time", "arguments": {}}'
PARIS = '{"city":"Paris"}'

TAGGED: list[tuple[str, str, list[tuple[str, str]]]] = [
    ("Hello there.", "Hello there.", []),
    (f"<tool_call>\n{W}\n</tool_call>", "", [("get_weather", PARIS)]),
    (
        f"<tool_call>\n{W}\n</tool_call>\n<tool_call>\n{T}\n</tool_call>",
        "",
        [("get_weather", PARIS), ("get_time", "{}")],
    ),
    (f"<tool_call>[\n{W},\n{T}\n]</tool_call>", "", [("get_weather", PARIS), ("get_time", "{}")]),
    (
        f"Let me check.\n<tool_call>{W}</tool_call>\nOne moment.",
        "Let me check.\n\nOne moment.",
        [("get_weather", PARIS)],
    ),
    ("<tool_call>[]</tool_call>", "", []),
    (
        '<tool_call>{"name": "get_weather", "arguments": {"city": </tool_call>',
        '<tool_call>{"name": "get_weather", "arguments": {"city": </tool_call>',
        [],
    ),
    (
        '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>',
        [],
    ),
    (
        f'<tool_call>[{W}, {{"name": "nope"}}]</tool_call>',
        f'<tool_call>[{W}, {{"name": "nope"}}]</tool_call>',
        [],
    ),
    (
        f"<tool_call>{T}</tool_call>ok <tool_call>{{bad</tool_call>",
        "ok <tool_call>{bad</tool_call>",
        [("get_time", "{}")],
    ),
    (f"Sure: <tool_call>\n{W}\n", "Sure:", [("get_weather", PARIS)]),  # unclosed but complete
    (
        'Sure: <tool_call>\n{"name": "get_weather", "argu',
        'Sure: <tool_call>\n{"name": "get_weather", "argu',
        [],
    ),
    ("a <tool_ca", "a <tool_ca", []),
    ("x < y and <b>bold</b> </tool_call>", "x < y and <b>bold</b> </tool_call>", []),
    (f"<tool_call>{T}<tool_call>{W}</tool_call>", f"<tool_call>{T}<tool_call>{W}</tool_call>", []),
    ('<tool_call>{"name": "get_time"}</tool_call>', "", [("get_time", "{}")]),
    (
        '<tool_call>{"name": "get_time", "arguments": {}, "id": 1}</tool_call>',
        '<tool_call>{"name": "get_time", "arguments": {}, "id": 1}</tool_call>',
        [],
    ),
    (
        '<tool_call>{"name": "get_time", "arguments": "{}"}</tool_call>',
        '<tool_call>{"name": "get_time", "arguments": "{}"}</tool_call>',
        [],
    ),
    ('<tool_call>{"name": ["get_time"]}</tool_call>', '<tool_call>{"name": ["get_time"]}</tool_call>', []),
    (
        '<tool_call>{"name": "get_weather", "arguments": {"t": NaN}}</tool_call>',
        '<tool_call>{"name": "get_weather", "arguments": {"t": NaN}}</tool_call>',
        [],
    ),
    (
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Zürich"}}</tool_call>',
        "",
        [("get_weather", '{"city":"Zürich"}')],
    ),
    ("  \n  ", "", []),
]

LLAMA_CASES: list[tuple[str, str, list[tuple[str, str]]]] = [
    ('{"name": "get_weather", "parameters": {"city": "Paris"}}', "", [("get_weather", PARIS)]),
    ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}', "", [("get_weather", PARIS)]),
    (
        ' {"name": "get_time", "parameters": {}}; {"name": "get_weather", "arguments": {"city": "Paris"}};\n',
        "",
        [("get_time", "{}"), ("get_weather", PARIS)],
    ),
    ('{"name": "get_time", "parameters": {"s": "a;b"}}', "", [("get_time", '{"s":"a;b"}')]),
    ("The weather is fine.", "The weather is fine.", []),
    ('It is {"name": "get_time", "parameters": {}}', 'It is {"name": "get_time", "parameters": {}}', []),
    (
        '{"name": "get_time", "parameters": {}} and more',
        '{"name": "get_time", "parameters": {}} and more',
        [],
    ),
    ('{"name": "get_time", "parameters": {', '{"name": "get_time", "parameters": {', []),
    ('{"name": "rm_rf", "parameters": {}}', '{"name": "rm_rf", "parameters": {}}', []),
    (
        '{"name": "get_time", "parameters": {}, "arguments": {}}',
        '{"name": "get_time", "parameters": {}, "arguments": {}}',
        [],
    ),
    ("<|python_tag|>", "<|python_tag|>", []),
    ("<|pyth", "<|pyth", []),
    ("<|pythagoras", "<|pythagoras", []),
    ("{} ;", "{} ;", []),
]

CASES = [(HERMES, *case) for case in TAGGED] + [(LLAMA, *case) for case in LLAMA_CASES]


def _expected(calls: list[tuple[str, str]]) -> list[ToolCall]:
    return [call(i, name, args) for i, (name, args) in enumerate(calls)]


@pytest.mark.parametrize(("fmt", "text", "content", "calls"), CASES)
def test_parse(fmt: ToolFormat, text: str, content: str, calls: list[tuple[str, str]]) -> None:
    assert parse_tool_calls(fmt, text, TOOLS, make_id=ids()) == (content, _expected(calls))


def test_smollm2_parses_as_hermes_does() -> None:
    for text, content, calls in TAGGED:
        assert parse_tool_calls(SMOLLM2, text, TOOLS, make_id=ids()) == (content, _expected(calls))


def test_no_tools_means_no_calls() -> None:
    text = f"<tool_call>{W}</tool_call>"
    assert parse_tool_calls(HERMES, text, (), make_id=ids()) == (text, [])


# ---- streaming ----
def _stream(fmt: ToolFormat, pieces: list[str]) -> list[Delta]:
    parser = ToolStreamParser(fmt, TOOLS, make_id=ids())
    deltas = [d for piece in pieces for d in parser.feed(piece)]
    return deltas + parser.finish()


def _joined(deltas: list[Delta]) -> tuple[str, list[ToolCall]]:
    content = "".join(d.text for d in deltas if isinstance(d, ContentDelta))
    calls: dict[int, list[str]] = {}
    for d in deltas:
        if isinstance(d, ToolCallDelta):
            if d.id is not None:
                assert d.index == len(calls) and d.name is not None
                calls[d.index] = [d.id, d.name, ""]
            calls[d.index][2] += d.arguments
    return content, [ToolCall(*c) for c in calls.values()]


def _check_stream(fmt: ToolFormat, text: str, pieces: list[str]) -> None:
    assert "".join(pieces) == text
    deltas = _stream(fmt, pieces)
    whole = parse_tool_calls(fmt, text, TOOLS, make_id=ids())
    assert _joined(deltas) == whole
    if "<" not in whole[0]:  # markup that made calls never shows, not even in part
        assert all("<" not in d.text for d in deltas if isinstance(d, ContentDelta))
    assert all(not isinstance(d, ContentDelta) or d.text for d in deltas)


@pytest.mark.parametrize(("fmt", "text"), [(fmt, text) for fmt, text, _, _ in CASES])
def test_stream_equals_parse_at_every_split(fmt: ToolFormat, text: str) -> None:
    _check_stream(fmt, text, [text])
    _check_stream(fmt, text, list(text))  # one character at a time
    for cut in range(len(text) + 1):
        _check_stream(fmt, text, [text[:cut], text[cut:]])
        for second in range(cut, min(len(text), cut + 12) + 1):
            _check_stream(fmt, text, [text[:cut], text[cut:second], text[second:]])


@given(st.sampled_from(CASES), st.lists(st.integers(min_value=0, max_value=400), max_size=12))
def test_stream_equals_parse_for_any_splits(case: tuple[ToolFormat, str, str, Any], cuts: list[int]) -> None:
    fmt, text = case[0], case[1]
    points = sorted({min(c, len(text)) for c in cuts})
    bounds = [0, *points, len(text)]
    _check_stream(fmt, text, [text[a:b] for a, b in itertools.pairwise(bounds)])


@given(
    st.lists(
        st.one_of(
            st.text(alphabet="ab <>/_\n{}", max_size=8),
            st.sampled_from(
                [f"<tool_call>{W}</tool_call>", "<tool_call>", "</tool_call>", f"[{T}]", T, "<tool_ca"]
            ),
        ),
        max_size=6,
    ),
    st.lists(st.integers(min_value=0, max_value=200), max_size=8),
)
def test_stream_equals_parse_on_generated_replies(parts: list[str], cuts: list[int]) -> None:
    text = "".join(parts)
    points = sorted({min(c, len(text)) for c in cuts})
    pieces = [text[a:b] for a, b in itertools.pairwise([0, *points, len(text)])]
    for fmt in (HERMES, LLAMA):
        _check_stream(fmt, text, pieces)


def test_stream_emits_content_before_a_call_closes() -> None:
    parser = ToolStreamParser(HERMES, TOOLS, make_id=ids())
    assert parser.feed("Let me check. <tool_") == [ContentDelta("Let me check.")]
    assert parser.feed('call>{"name": "get_time", ') == []
    assert parser.feed('"arguments": {}}</tool_call> Done') == [
        ToolCallDelta(0, "call_" + "0" * 24, "get_time", "{}"),
        ContentDelta("  Done"),  # the space held back before the call, and its own
    ]
    assert parser.finish() == [] and parser.call_count == 1


def test_llama_stream_holds_a_reply_that_starts_like_a_call() -> None:
    parser = ToolStreamParser(LLAMA, TOOLS, make_id=ids())
    assert parser.feed('{"name": "get_time", "parameters": {}}') == []
    assert parser.finish() == [ToolCallDelta(0, "call_" + "0" * 24, "get_time", "{}")]
    plain = ToolStreamParser(LLAMA, TOOLS, make_id=ids())
    assert plain.feed(" Hi") == [ContentDelta("Hi")] and plain.feed(" there") == [ContentDelta(" there")]


def test_tool_call_delta_to_openai() -> None:
    first = ToolCallDelta(1, "call_x", "get_time", "{")
    assert first.to_openai() == {
        "index": 1,
        "id": "call_x",
        "type": "function",
        "function": {"name": "get_time", "arguments": "{"},
    }
    assert ToolCallDelta(1, None, None, "}").to_openai() == {"index": 1, "function": {"arguments": "}"}}
    assert call(0, "get_time", "{}").to_openai()["function"] == {"name": "get_time", "arguments": "{}"}


# ---- forced calls ----
def test_required_schema_for_a_named_function() -> None:
    named = parse_tool_spec([WEATHER, TIME], {"type": "function", "function": {"name": "get_weather"}})
    prefix, schema = required_schema(HERMES, named)
    assert prefix == "<tool_call>\n"
    assert schema == {
        "type": "object",
        "properties": {"name": {"const": "get_weather"}, "arguments": WEATHER_PARAMS},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    assert validator.is_valid(json.loads(W))
    assert not validator.is_valid({"name": "get_time", "arguments": {}})
    assert not validator.is_valid({"name": "get_weather", "arguments": {}})  # city is required
    assert not validator.is_valid({"name": "get_weather", "arguments": {"city": "x"}, "more": 1})


def test_required_schema_for_any_tool() -> None:
    required = parse_tool_spec([WEATHER, TIME], "required")
    prefix, schema = required_schema(HERMES, required)
    validator = jsonschema.Draft202012Validator(schema)
    assert validator.is_valid(json.loads(W)) and validator.is_valid(json.loads(T))
    assert not validator.is_valid({"name": "other", "arguments": {}})
    assert not validator.is_valid({"name": "get_time", "arguments": []})

    prefix, schema = required_schema(SMOLLM2, required)
    assert prefix == "<tool_call>" and schema["minItems"] == 1
    validator = jsonschema.Draft202012Validator(schema)
    assert validator.is_valid([json.loads(W), json.loads(T)])
    assert not validator.is_valid([]) and not validator.is_valid(json.loads(T))

    prefix, schema = required_schema(LLAMA, required)
    assert prefix is None
    assert jsonschema.Draft202012Validator(schema).is_valid({"name": "get_time", "parameters": {}})


@pytest.mark.parametrize(
    ("fmt", "body"),
    [(HERMES, T), (SMOLLM2, f"[{T}]"), (LLAMA, '{"name": "get_time", "parameters": {}}')],
)
def test_parse_constrained(fmt: ToolFormat, body: str) -> None:
    assert parse_constrained(fmt, body, TOOLS, make_id=ids()) == ("", [call(0, "get_time", "{}")])
    cut = body[:-1]  # max_tokens ended it: content, as parse_tool_calls would have it
    content, calls = parse_constrained(fmt, cut, TOOLS, make_id=ids())
    assert calls == [] and content.endswith(cut.strip())
    parser = ToolStreamParser(fmt, TOOLS, make_id=ids())
    prefix = required_schema(fmt, parse_tool_spec([WEATHER, TIME], "required")).prefix
    deltas = parser.feed(prefix or "") + parser.feed(body) + parser.finish()
    assert deltas == [ToolCallDelta(0, "call_" + "0" * 24, "get_time", "{}")]


def test_prompts_follow_the_choice() -> None:
    auto = tool_prompt(SMOLLM2, SPEC)
    assert "refuse to answer" not in auto and "answer normally" in auto
    forced = tool_prompt(SMOLLM2, parse_tool_spec([WEATHER, TIME], "required"))
    assert "If none of the functions can be used, point it out and refuse to answer." in forced
    assert tool_prompt(HERMES, SPEC).endswith("If no function call is needed, answer normally.")
