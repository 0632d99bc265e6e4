"""Interlock's sampling onto vLLM's SamplingParams (no vLLM needed: keyword arguments)."""

from __future__ import annotations

import pytest

from interlock.engine.vllm.sampling import sampling_kwargs, structured_kwargs
from interlock.errors import InvalidRequest
from interlock.protocol import SamplingParams, StructuredOutput


def test_every_field_maps_to_vllms_name() -> None:
    s = SamplingParams(
        max_tokens=20,
        temperature=0.7,
        top_p=0.9,
        top_k=40,
        min_p=0.05,
        seed=7,
        stop_token_ids=(2, 5),
        ignore_eos=True,
        min_tokens=3,
        logprobs=2,
        presence_penalty=0.5,
        frequency_penalty=-0.25,
        repetition_penalty=1.2,
        logit_bias=((11, 5.0), (12, -100.0)),
        structured=StructuredOutput("regex", "[0-9]+"),
        prompt_logprobs=4,
    )
    assert sampling_kwargs(s) == {
        "max_tokens": 20,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 40,
        "min_p": 0.05,
        "seed": 7,
        "stop_token_ids": [2, 5],
        "ignore_eos": True,
        "min_tokens": 3,
        "logprobs": 2,
        "presence_penalty": 0.5,
        "frequency_penalty": -0.25,
        "repetition_penalty": 1.2,
        "logit_bias": {11: 5.0, 12: -100.0},
        "structured_outputs": {"regex": "[0-9]+"},
        "prompt_logprobs": 4,
    }
    assert set(sampling_kwargs(s)) >= set(SamplingParams.__struct_fields__) - {"structured"}


def test_neutral_defaults_and_a_migration() -> None:
    k = sampling_kwargs(SamplingParams(max_tokens=10, min_tokens=4), done=3)
    assert (k["max_tokens"], k["min_tokens"], k["top_k"]) == (7, 1, -1)
    assert (k["logit_bias"], k["structured_outputs"], k["repetition_penalty"]) == (None, None, 1.0)
    assert sampling_kwargs(SamplingParams(max_tokens=10), prefill_only=True)["max_tokens"] == 1
    assert k["prompt_logprobs"] is None
    # a migrated request's first leg sent its prompt logprobs
    assert (
        sampling_kwargs(SamplingParams(max_tokens=10, prompt_logprobs=2), done=3)["prompt_logprobs"] is None
    )
    assert sampling_kwargs(SamplingParams(max_tokens=10, prompt_logprobs=0))["prompt_logprobs"] == 0


@pytest.mark.parametrize(
    ("structured", "expected"),
    [
        (StructuredOutput("json_schema", '{"type": "object"}'), {"json": '{"type": "object"}'}),
        (StructuredOutput("json_object"), {"json_object": True}),
        (StructuredOutput("regex", "a|b"), {"regex": "a|b"}),
        (StructuredOutput("choice", '["yes", "no"]'), {"choice": ["yes", "no"]}),
        (StructuredOutput("grammar", 'root ::= "x"'), {"grammar": 'root ::= "x"'}),
    ],
)
def test_structured_outputs_map_to_one_constraint(
    structured: StructuredOutput, expected: dict[str, object]
) -> None:
    assert structured_kwargs(structured) == expected


@pytest.mark.parametrize(
    "structured",
    [StructuredOutput("choice", "yes"), StructuredOutput("choice", "[1]"), StructuredOutput("yaml")],
)
def test_a_bad_structured_output_is_refused_by_name(structured: StructuredOutput) -> None:
    with pytest.raises(InvalidRequest) as info:
        structured_kwargs(structured)
    assert info.value.param == "response_format"
