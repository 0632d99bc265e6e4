"""Constraints: bitmasks applied to logits rows, untouched rows bit-identical, matchers kept in
step with each request's outputs (preemption, migration), EOS only where a constraint cannot be
followed; and greedy generation with the real model under JSON schemas (TorchRunner in an
EngineCore) that parses and validates."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import jsonschema
import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from interlock.engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from interlock.engine.constraints import Constraints, apply_bitmask, bitmask_bias
from interlock.engine.core import EngineCore
from interlock.engine.model import LlamaModel
from interlock.engine.runner import ScheduledRequest
from interlock.engine.runners.torch_runner import TorchRunner
from interlock.model_store import resolve_model
from interlock.protocol import GenerateRequest, SamplingParams, StructuredOutput
from tests.engine.conftest import run_to_end, tokens

EOS = 2
VOCAB = 49152
ANSWER = StructuredOutput(kind="choice", spec='["yes", "no"]')
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def folder() -> Path:
    return resolve_model("smollm2", progress=False)


@pytest.fixture(scope="module")
def tokenizer(folder: Path) -> Tokenizer:
    return Tokenizer.from_file(str(folder / "tokenizer.json"))


def constraints(folder: Path | None, vocab: int = VOCAB) -> Constraints:
    return Constraints(folder, vocab_size=vocab, eos_token_ids=(EOS,))


def row(
    rid: str,
    outputs: Sequence[int] = (),
    structured: StructuredOutput | None = ANSWER,
    prompt: Sequence[int] = (1, 2, 3),
) -> ScheduledRequest:
    """The sampling chunk of a request with ``outputs`` so far (its last known token fed)."""
    fed = [*prompt, *outputs]
    sampling = SamplingParams(temperature=0.0, structured=structured)
    return ScheduledRequest(
        rid,
        fed[-1:],
        len(fed) - 1,
        [0],
        sampling,
        do_sample=True,
        num_output_tokens=len(outputs),
        prompt_token_ids=prompt,
        output_token_ids=list(outputs),
    )


def finite(logits: torch.Tensor, i: int) -> set[int]:
    return set(torch.isfinite(logits[i]).nonzero().flatten().tolist())


def test_apply_bitmask_keeps_allowed_logits_exactly_and_masks_the_rest() -> None:
    vocab = 100  # not a multiple of 32
    logits = torch.randn(3, vocab)
    before = logits.clone()
    bitmask = np.zeros((2, 4), dtype=np.int32)
    bitmask.view(np.uint32)[0, 0] = (1 << 0) | (1 << 31)
    bitmask.view(np.uint32)[1, 3] = 1 << 3  # token 99
    apply_bitmask(logits, bitmask, rows=[2, 0])
    assert finite(logits, 2) == {0, 31} and finite(logits, 0) == {99}
    assert torch.equal(logits[1], before[1])
    for i, kept in ((2, [0, 31]), (0, [99])):
        assert torch.equal(logits[i, kept], before[i, kept])
        assert (logits[i][~torch.isfinite(logits[i])] == float("-inf")).all()


def test_ids_past_the_bitmask_are_never_allowed() -> None:
    """A model whose vocabulary is wider than its tokenizer's: padded ids are masked off."""
    bitmask = np.full((1, 2), -1, dtype=np.int32)  # 64 ids allowed
    assert np.isfinite(bitmask_bias(bitmask, 64)).all()
    bias = bitmask_bias(bitmask, 70)
    assert np.isfinite(bias[0, :64]).all() and (bias[0, 64:] == -np.inf).all()


def test_no_constrained_row_means_no_work_and_identical_logits(folder: Path) -> None:
    c = constraints(folder)
    logits = torch.randn(4, VOCAB)
    before = logits.clone()
    requests = [row(f"r{i}", structured=None) for i in range(4)]
    c.forget(["gone"])
    c.mask(logits, requests)
    c.accept(requests, [5, 6, 7, 8])
    assert torch.equal(logits, before)
    assert c._compiler is None  # the grammar engine was never loaded


def test_only_constrained_rows_are_masked(folder: Path, tokenizer: Tokenizer) -> None:
    c = constraints(folder)
    logits = torch.randn(3, VOCAB)
    before = logits.clone()
    requests = [row("free", structured=None), row("yn"), row("free2", structured=None)]
    c.mask(logits, requests)
    assert torch.equal(logits[0], before[0]) and torch.equal(logits[2], before[2])
    firsts = {tokenizer.decode([t]) for t in finite(logits, 1)}
    assert firsts and all("yes".startswith(f) or "no".startswith(f) for f in firsts)
    assert torch.equal(logits[1, list(finite(logits, 1))], before[1, list(finite(logits, 1))])


def _walk(c: Constraints, rid: str, text_tokens: list[int]) -> list[set[int]]:
    """Feed ``text_tokens`` as the request's samples, step by step; the allowed set at each."""
    seen = []
    for k, token in enumerate([*text_tokens, EOS]):
        logits = torch.zeros(1, VOCAB)
        request = row(rid, text_tokens[:k])
        c.mask(logits, [request])
        seen.append(finite(logits, 0))
        assert token in seen[-1]
        c.accept([request], [token])
    return seen


def test_a_preempted_or_migrated_request_gets_the_same_masks(folder: Path, tokenizer: Tokenizer) -> None:
    yes = tokenizer.encode("yes", add_special_tokens=False).ids
    c = constraints(folder)
    walked = _walk(c, "a", yes)
    assert walked[-1] == {EOS}  # the grammar is complete: only EOS
    # Preempted after its first token: its matcher is dropped, then it comes back.
    c.forget(["a"])
    assert c.matcher("a") is None
    logits = torch.zeros(1, VOCAB)
    c.mask(logits, [row("a", yes[:1])])
    assert finite(logits, 0) == walked[1]
    # Migrated to a fresh runner with its outputs as resume tokens (a new id, outputs known).
    fresh = constraints(folder)
    logits = torch.zeros(1, VOCAB)
    fresh.mask(logits, [row("a~1", yes)])
    assert finite(logits, 0) == {EOS}
    matcher = fresh.matcher("a~1")
    assert matcher is not None and matcher.tokens == yes


def test_outputs_the_grammar_refuses_end_the_request(folder: Path, tokenizer: Tokenizer) -> None:
    c = constraints(folder)
    logits = torch.zeros(1, VOCAB)
    c.mask(logits, [row("x", tokenizer.encode("maybe", add_special_tokens=False).ids)])
    assert finite(logits, 0) == {EOS}


def test_a_refused_sample_ends_the_request(folder: Path, tokenizer: Tokenizer) -> None:
    c = constraints(folder)
    request = row("x")
    c.mask(torch.zeros(1, VOCAB), [request])
    (bad,) = tokenizer.encode("}", add_special_tokens=False).ids
    c.accept([request], [bad])  # a sampler that ignored the mask
    logits = torch.zeros(1, VOCAB)
    c.mask(logits, [row("x", [bad])])
    assert finite(logits, 0) == {EOS}


def test_without_a_tokenizer_or_with_a_bad_spec_a_row_gets_eos_only(folder: Path) -> None:
    logits = torch.zeros(2, VOCAB)
    constraints(None).mask(logits[:1], [row("a")])
    bad = StructuredOutput(kind="regex", spec="a(b")  # no frontend checked it
    constraints(folder).mask(logits[1:], [row("b", structured=bad)])
    assert finite(logits, 0) == {EOS} and finite(logits, 1) == {EOS}


def test_matchers_are_bounded(folder: Path) -> None:
    c = Constraints(folder, vocab_size=VOCAB, eos_token_ids=(EOS,), max_matchers=2)
    for rid in ("a", "b", "c"):
        c.mask(torch.zeros(1, VOCAB), [row(rid)])
    assert c.matcher("a") is None and c.matcher("b") is not None and c.matcher("c") is not None


# ---- the real model ----
SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "city": {"type": "string", "maxLength": 40},
        },
        "required": ["name", "age", "city"],
        "additionalProperties": False,
    },
    "order": {
        "type": "object",
        "properties": {
            "status": {"enum": ["pending", "shipped", "delivered"]},
            "items": {
                "type": "array",
                "minItems": 1,
                "maxItems": 3,
                "items": {
                    "type": "object",
                    "properties": {
                        "sku": {"type": "string", "maxLength": 12},
                        "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
                    },
                    "required": ["sku", "quantity"],
                    "additionalProperties": False,
                },
            },
        },
        "required": ["status", "items"],
        "additionalProperties": False,
    },
    "answer": {
        "type": "object",
        "properties": {
            "answer": {"type": "boolean"},
            "confidence": {"enum": ["low", "medium", "high"]},
            "reason": {"type": "string", "maxLength": 60},
        },
        "required": ["answer", "confidence", "reason"],
        "additionalProperties": False,
    },
}
QUESTIONS = {
    "person": "Describe a person who lives in Paris as JSON.",
    "order": "Write a JSON order of two books.",
    "answer": "Is the sky blue? Answer in JSON.",
}


@pytest.fixture(scope="module")
def model(folder: Path) -> LlamaModel:
    return LlamaModel.load(folder, torch.float32, torch.device("cpu"), 512)


def _chat(tokenizer: Tokenizer, question: str) -> list[int]:
    text = f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    return tokenizer.encode(text, add_special_tokens=False).ids


@pytest.mark.slow
def test_greedy_generation_under_json_schemas_parses_and_validates(
    model: LlamaModel, folder: Path, tokenizer: Tokenizer
) -> None:
    config = EngineConfig(
        model=ModelConfig(runner="torch", dtype="float32"),
        cache=CacheConfig(block_size=16, num_blocks=64),
        scheduler=SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=8, max_model_len=512),
    )
    core = EngineCore(config, TorchRunner(model, num_blocks=64, block_size=16, folder=folder))
    cases = {
        **{name: ("json_schema", json.dumps(s)) for name, s in SCHEMAS.items()},
        "any": ("json_object", ""),
    }
    for name, (kind, spec) in cases.items():
        sampling = SamplingParams(
            max_tokens=160, temperature=0.0, structured=StructuredOutput(kind=kind, spec=spec)
        )
        question = QUESTIONS.get(name, "Give your name and age as a JSON object.")
        core.add_request(
            GenerateRequest(request_id=name, token_ids=tuple(_chat(tokenizer, question)), sampling=sampling)
        )
    outs = run_to_end(core)
    for name in cases:
        generated = tokens(outs[name])
        assert outs[name][-1].finish_reason == "stop", (name, tokenizer.decode(generated))
        value = json.loads(tokenizer.decode([t for t in generated if t != EOS]))
        if name in SCHEMAS:
            jsonschema.validate(value, SCHEMAS[name])
        else:
            assert isinstance(value, dict)
