"""SamplingParams: the penalty, bias and structured-output fields, refused by name when bad."""

from __future__ import annotations

import math

import msgspec
import pytest

from interlock.errors import InvalidRequest
from interlock.protocol import SamplingParams, StructuredOutput


def test_defaults_are_neutral() -> None:
    s = SamplingParams()
    assert (s.presence_penalty, s.frequency_penalty, s.repetition_penalty) == (0.0, 0.0, 1.0)
    assert s.logit_bias == () and s.structured is None and not s.penalized


@pytest.mark.parametrize(
    "field",
    [
        {"presence_penalty": 0.5},
        {"frequency_penalty": -0.1},
        {"repetition_penalty": 1.2},
        {"logit_bias": ((3, 1.0),)},
    ],
)
def test_any_penalty_or_bias_is_penalized(field: dict[str, object]) -> None:
    assert SamplingParams(**field).penalized  # type: ignore[arg-type]


def test_new_fields_round_trip() -> None:
    s = SamplingParams(
        presence_penalty=0.5,
        frequency_penalty=-1.0,
        repetition_penalty=1.3,
        logit_bias=((5, -100.0), (7, 2.5)),
        structured=StructuredOutput("choice", '["yes", "no"]'),
    )
    s.validate()
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(s), type=SamplingParams) == s
    assert msgspec.json.decode(msgspec.json.encode(s), type=SamplingParams) == s


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"presence_penalty": math.nan}, "presence_penalty"),
        ({"frequency_penalty": -2.01}, "frequency_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"repetition_penalty": -1.0}, "repetition_penalty"),
        ({"repetition_penalty": math.inf}, "repetition_penalty"),
        ({"logit_bias": ((-1, 1.0),)}, "logit_bias"),
        ({"logit_bias": ((3, 100.5),)}, "logit_bias"),
        ({"logit_bias": ((3, math.nan),)}, "logit_bias"),
        ({"logit_bias": ((3, 1.0), (3, 2.0))}, "logit_bias"),
        ({"structured": StructuredOutput("yaml", "")}, "response_format"),
        ({"prompt_logprobs": -1}, "prompt_logprobs"),
        ({"prompt_logprobs": 21}, "prompt_logprobs"),
    ],
)
def test_bad_values_are_refused_by_name(kwargs: dict[str, object], param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        SamplingParams(**kwargs).validate()  # type: ignore[arg-type]
    assert info.value.param == param


@pytest.mark.parametrize("kind", ["json_schema", "json_object", "regex", "choice", "grammar"])
def test_every_structured_kind_is_accepted(kind: str) -> None:
    SamplingParams(structured=StructuredOutput(kind, "" if kind == "json_object" else "x")).validate()


def test_edges_of_the_ranges_are_accepted() -> None:
    SamplingParams(
        presence_penalty=-2.0,
        frequency_penalty=2.0,
        repetition_penalty=1e-3,
        logit_bias=((0, -100.0), (9, 100.0)),
    ).validate()
    SamplingParams(prompt_logprobs=0).validate()
    SamplingParams(prompt_logprobs=20).validate()
