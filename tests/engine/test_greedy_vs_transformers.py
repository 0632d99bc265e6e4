"""Greedy output of EngineCore + TorchRunner equals transformers' ``generate`` token for token.

Five chat prompts (chat template applied), in four regimes: plain continuous batching;
prefix-cache hits (the same prompts again, after the first run filled the cache); chunked
prefill (a 16-token budget per step); and forced preemption by recompute (a KV pool too small
for the batch). fp32 on both sides: in bf16 the two implementations round differently and an
argmax can flip on a near tie, which says nothing about correctness.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import pytest
import torch

from interlock.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from interlock.engine.core import EngineCore
from interlock.engine.model import LlamaModel
from interlock.engine.runners.torch_runner import TorchRunner
from interlock.model_store import resolve_model
from interlock.protocol import GenerateRequest, SamplingParams
from tests.engine.conftest import Recorder

os.environ.setdefault("HF_HUB_OFFLINE", "1")
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Name three primary colors.",
    "Explain in one sentence what a CPU does.",
    "What is 12 times 7?",
]
MAX_TOKENS = 24
EOS = 2


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model("smollm2", progress=False))
    return [
        list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True, return_dict=True
            )["input_ids"]
        )
        for q in QUESTIONS
    ]


@pytest.fixture(scope="module")
def expected(prompts: list[list[int]]) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(resolve_model("smollm2", progress=False), dtype=torch.float32)
    outputs = []
    with torch.no_grad():
        for prompt in prompts:
            out = hf.generate(
                torch.tensor([prompt]),
                max_new_tokens=MAX_TOKENS,
                do_sample=False,
                eos_token_id=EOS,
                pad_token_id=EOS,
            )
            outputs.append(out[0, len(prompt) :].tolist())
    return outputs


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    return LlamaModel.load(resolve_model("smollm2", progress=False), torch.float32, torch.device("cpu"), 512)


def _config(num_blocks: int, budget: int = 2048) -> EngineConfig:
    return EngineConfig(
        cache=CacheConfig(num_blocks=num_blocks),
        scheduler=SchedulerConfig(max_num_batched_tokens=budget, max_model_len=512),
    )


def _run(core: EngineCore, prompts: Sequence[list[int]], tag: str) -> tuple[list[list[int]], list[int]]:
    """Generate all prompts together; return each one's tokens and cached-token count."""
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    for i, prompt in enumerate(prompts):
        core.add_request(GenerateRequest(request_id=f"{tag}{i}", token_ids=tuple(prompt), sampling=params))
    tokens: dict[str, list[int]] = {f"{tag}{i}": [] for i in range(len(prompts))}
    cached: dict[str, int] = {}
    while core.has_unfinished():
        for out in core.step().outputs:
            assert out.error is None, out.error
            tokens[out.request_id] += out.token_ids
            cached[out.request_id] = max(cached.get(out.request_id, 0), out.num_cached_tokens)
    core.check_integrity()
    return [tokens[f"{tag}{i}"] for i in range(len(prompts))], [
        cached[f"{tag}{i}"] for i in range(len(prompts))
    ]


def _engine(model: LlamaModel, num_blocks: int, budget: int = 2048) -> tuple[EngineCore, Recorder]:
    recorder = Recorder(TorchRunner(model, num_blocks=num_blocks))
    return EngineCore(_config(num_blocks, budget), recorder), recorder  # type: ignore[arg-type]


def test_plain_batch_matches_transformers(
    model: LlamaModel, prompts: list[list[int]], expected: list[list[int]]
) -> None:
    core, _ = _engine(model, num_blocks=256)
    got, _ = _run(core, prompts, "plain")
    assert got == expected


def test_prefix_cache_hits_match_transformers(
    model: LlamaModel, prompts: list[list[int]], expected: list[list[int]]
) -> None:
    core, _ = _engine(model, num_blocks=256)
    _run(core, prompts, "first")
    got, cached = _run(core, prompts, "again")
    assert got == expected
    assert all(c >= 16 for c in cached), cached


def test_chunked_prefill_matches_transformers(
    model: LlamaModel, prompts: list[list[int]], expected: list[list[int]]
) -> None:
    core, recorder = _engine(model, num_blocks=256, budget=16)
    got, _ = _run(core, prompts, "chunked")
    assert got == expected
    assert any(not s.do_sample for b in recorder.batches for s in b.scheduled)  # really chunked


def test_preemption_by_recompute_matches_transformers(
    model: LlamaModel, prompts: list[list[int]], expected: list[list[int]]
) -> None:
    longest = max(len(p) for p in prompts) + MAX_TOKENS
    core, recorder = _engine(model, num_blocks=(longest + 15) // 16 + 2)
    got, _ = _run(core, prompts, "tight")
    assert got == expected
    # A preempted request is reported as ended to the runner, then scheduled again.
    ended_then_resumed = {
        rid
        for i, b in enumerate(recorder.batches)
        for rid in b.finished_request_ids
        if any(s.request_id == rid for later in recorder.batches[i + 1 :] for s in later.scheduled)
    }
    assert ended_then_resumed, "the pool was meant to force preemption"
