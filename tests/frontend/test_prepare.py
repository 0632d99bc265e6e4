"""From parsed requests to prompt ids and SamplingParams; the context-length rule."""

from __future__ import annotations

import asyncio
import json

import pytest

from interlock.errors import InvalidRequest, PromptTooLong
from interlock.frontend.backend import ModelEntry
from interlock.frontend.prepare import prompt_ids, sampling_params
from interlock.frontend.schemas import parse_chat, parse_completion
from interlock.frontend.tokenizer import ModelTokenizer

ENTRY = ModelEntry("m", "/nowhere", 100)


def chat(**fields: object):  # type: ignore[no-untyped-def]
    return parse_chat(
        json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}], **fields}).encode()
    )


def completion(**fields: object):  # type: ignore[no-untyped-def]
    return parse_completion(json.dumps({"model": "m", "prompt": "x", **fields}).encode())


def test_sampling_fields_map_through() -> None:
    params = sampling_params(
        chat(
            temperature=0,
            top_p=0.5,
            top_k=4,
            min_p=0.1,
            seed=3,
            logprobs=True,
            top_logprobs=2,
            stop_token_ids=[9],
        ),
        prompt_len=10,
        entry=ENTRY,
        eos_token_ids=(2,),
    )
    assert (params.temperature, params.top_p, params.top_k, params.min_p, params.seed) == (0, 0.5, 4, 0.1, 3)
    assert params.logprobs == 2
    assert params.stop_token_ids == (9, 2)


def test_ignore_eos_leaves_eos_out_of_stop_ids() -> None:
    params = sampling_params(chat(ignore_eos=True), prompt_len=1, entry=ENTRY, eos_token_ids=(2,))
    assert params.stop_token_ids == () and params.ignore_eos


def test_max_tokens_defaults_fill_the_context_for_chat_and_16_for_completions() -> None:
    assert sampling_params(chat(), prompt_len=30, entry=ENTRY, eos_token_ids=()).max_tokens == 70
    assert sampling_params(completion(), prompt_len=30, entry=ENTRY, eos_token_ids=()).max_tokens == 16
    assert sampling_params(completion(), prompt_len=90, entry=ENTRY, eos_token_ids=()).max_tokens == 10


def test_over_the_context_names_the_limit() -> None:
    with pytest.raises(PromptTooLong, match="maximum context length is 100 tokens") as info:
        sampling_params(chat(max_completion_tokens=50), prompt_len=60, entry=ENTRY, eos_token_ids=())
    assert info.value.param == "max_completion_tokens"
    with pytest.raises(PromptTooLong, match="100"):
        sampling_params(chat(), prompt_len=100, entry=ENTRY, eos_token_ids=())
    assert sampling_params(chat(max_tokens=40), prompt_len=60, entry=ENTRY, eos_token_ids=()).max_tokens == 40


def test_bad_sampling_values_are_invalid_requests() -> None:
    for fields, param in (
        ({"max_tokens": 0}, "max_tokens"),
        ({"top_p": -0.1}, "top_p"),
        ({"temperature": -1}, "temperature"),
    ):
        with pytest.raises(InvalidRequest) as info:
            sampling_params(chat(**fields), prompt_len=1, entry=ENTRY, eos_token_ids=())
        assert info.value.param == param


def test_prompt_ids(tok: ModelTokenizer) -> None:
    ids = asyncio.run(prompt_ids(chat(), tok))
    assert tok.decode(ids, skip_special_tokens=False).endswith("<|im_start|>assistant\n")
    assert ids[0] == tok.tokenizer.token_to_id("<|im_start|>")  # the template's, not a second BOS
    assert asyncio.run(prompt_ids(completion(prompt=[5, 6]), tok)) == [5, 6]
    assert list(asyncio.run(prompt_ids(completion(prompt="Hi there"), tok))) == tok.encode(
        "Hi there", add_special_tokens=True
    )
    with pytest.raises(InvalidRequest, match="vocabulary"):
        asyncio.run(prompt_ids(completion(prompt=[10**7]), tok))
