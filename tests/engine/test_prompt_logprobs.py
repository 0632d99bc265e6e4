"""Prompt logprobs (``SamplingParams.prompt_logprobs``, vLLM's meaning) through the engine.

On the real model (SmolLM2, fp32) they equal ``log_softmax`` of transformers' forward over the
whole prompt, with the prompt in one chunk, in three, and after another request cached it. On
the mock runner: one entry per prompt token after the first, in the first output only, never
twice across preemptions, never for a migrated request, never with remote KV.
"""

from __future__ import annotations

import os

import pytest
import torch

from interlock.engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from interlock.engine.core import EngineCore
from interlock.engine.model import LlamaModel
from interlock.engine.request import RequestStatus
from interlock.engine.runners.mock import MockRunner, reference_output
from interlock.engine.runners.torch_runner import TorchRunner
from interlock.engine.sampler import LOGPROB_ROWS, token_logprobs
from interlock.model_store import resolve_model
from interlock.protocol import (
    GenerateOutput,
    GenerateRequest,
    KVTransferParams,
    SamplingParams,
    TokenLogprobs,
)
from tests.engine.conftest import VOCAB, Recorder, make_config, make_engine, request, run_to_end, tokens
from tests.engine.test_torch_runner import PROMPT

os.environ.setdefault("HF_HUB_OFFLINE", "1")
TOP = 3


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    return LlamaModel.load(resolve_model("smollm2", progress=False), torch.float32, torch.device("cpu"), 256)


@pytest.fixture(scope="module")
def reference() -> torch.Tensor:
    """transformers' fp32 logprobs over PROMPT: row p is the distribution of token p + 1."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(resolve_model("smollm2", progress=False), dtype=torch.float32)
    with torch.no_grad():
        logits = hf(torch.tensor([PROMPT])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


def _core(model: LlamaModel, budget: int) -> EngineCore:
    config = EngineConfig(
        model=ModelConfig(dtype="float32"),
        cache=CacheConfig(block_size=16, num_blocks=32),
        scheduler=SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=4, max_model_len=256),
    )
    return EngineCore(config, TorchRunner(model, num_blocks=32, block_size=16, seed=0))


def _ask(rid: str, prompt_logprobs: int | None, max_tokens: int = 4) -> GenerateRequest:
    sampling = SamplingParams(
        max_tokens=max_tokens, temperature=0.0, ignore_eos=True, prompt_logprobs=prompt_logprobs
    )
    return GenerateRequest(request_id=rid, token_ids=tuple(PROMPT), sampling=sampling)


def _check_against(entries: tuple[TokenLogprobs, ...] | None, reference: torch.Tensor, top_n: int) -> None:
    assert entries is not None and len(entries) == len(PROMPT) - 1
    assert [e.token_id for e in entries] == PROMPT[1:]
    want = reference[torch.arange(len(PROMPT) - 1), torch.tensor(PROMPT[1:])]
    assert torch.allclose(torch.tensor([e.logprob for e in entries]), want, atol=2e-3)
    best, best_ids = reference[:-1].topk(top_n, dim=-1)
    for p, e in enumerate(entries):
        assert len(e.top) == top_n
        values = [lp for _, lp in e.top]
        assert values == sorted(values, reverse=True)
        assert torch.allclose(torch.tensor(values), best[p], atol=2e-3)
        assert [t for t, _ in e.top[:1]] == best_ids[p, :1].tolist()


@pytest.mark.parametrize("budget", [256, 16])  # one chunk; 16 + 16 + 4 tokens
def test_prompt_logprobs_equal_a_full_forward_only_in_the_first_output(
    model: LlamaModel, reference: torch.Tensor, budget: int
) -> None:
    core = _core(model, budget)
    core.add_request(_ask("asks", TOP))
    core.add_request(_ask("plain", None))  # in the same steps: no effect on it
    outs = run_to_end(core)
    _check_against(outs["asks"][0].prompt_logprobs, reference, TOP)
    assert all(o.prompt_logprobs is None for o in outs["asks"][1:] + outs["plain"])
    assert tokens(outs["asks"]) == tokens(outs["plain"])


def test_a_cached_prompt_is_computed_again_for_its_logprobs(
    model: LlamaModel, reference: torch.Tensor
) -> None:
    core = _core(model, 256)
    core.add_request(_ask("first", None))
    run_to_end(core)
    core.add_request(_ask("asks", 0))
    asks = run_to_end(core)["asks"]
    assert asks[0].num_cached_tokens == 0
    _check_against(asks[0].prompt_logprobs, reference, 0)
    core.add_request(_ask("after", None))
    assert run_to_end(core)["after"][0].num_cached_tokens == 32  # its blocks still cached


def test_token_logprobs_in_slices_equal_one_log_softmax() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(LOGPROB_ROWS + 5, 50, generator=g)
    ids = torch.randint(0, 50, (LOGPROB_ROWS + 5,), generator=g).tolist()
    entries = token_logprobs(logits, ids, 2)
    full = torch.log_softmax(logits, dim=-1)
    assert [e.token_id for e in entries] == ids
    assert torch.allclose(torch.tensor([e.logprob for e in entries]), full[torch.arange(len(ids)), ids])
    assert [e.top[0][0] for e in entries] == full.argmax(dim=-1).tolist()
    assert all(len(e.top) == 2 and e.top[0][1] >= e.top[1][1] for e in entries)
    assert token_logprobs(logits[:2], ids[:2], 0)[0].top == ()


# ---- the engine's bookkeeping, on the mock runner ----
def _mock_entries(prompt: list[int], top_n: int) -> tuple[TokenLogprobs, ...]:
    return tuple(TokenLogprobs(t, 0.0, ((t, 0.0),) * min(top_n, 1)) for t in prompt[1:])


def _carrying(outs: list[GenerateOutput]) -> list[int]:
    return [i for i, o in enumerate(outs) if o.prompt_logprobs is not None]


def test_each_chunk_asks_for_its_prompt_rows_but_the_last_prompt_position() -> None:
    config = make_config(max_num_batched_tokens=8, block_size=4)
    recorder = Recorder(MockRunner(num_blocks=64, block_size=4, vocab_size=VOCAB, timing=None))
    engine = EngineCore(config, recorder)  # type: ignore[arg-type]
    prompt = list(range(10, 30))
    engine.add_request(request("a", prompt, 3, prompt_logprobs=2))
    outs = run_to_end(engine)["a"]
    asked = [s.prompt_logprob_positions for b in recorder.batches for s in b.scheduled]
    assert asked == [range(0, 8), range(8, 16), range(16, 19), range(0), range(0)]
    assert _carrying(outs) == [0] and outs[0].token_ids
    assert outs[0].prompt_logprobs == _mock_entries(prompt, 2)
    assert tokens(outs) == reference_output(prompt, 3, vocab_size=VOCAB)


def test_one_token_prompt_gets_an_empty_tuple_and_max_tokens_one_works() -> None:
    engine = make_engine()
    engine.add_request(request("one", [5], 2, prompt_logprobs=0))
    engine.add_request(request("score", [5, 6, 7], 1, prompt_logprobs=1))
    outs = run_to_end(engine)
    assert outs["one"][0].prompt_logprobs == ()
    assert outs["score"][0].finished and outs["score"][0].prompt_logprobs == _mock_entries([5, 6, 7], 1)


@pytest.mark.parametrize(("num_blocks", "when"), [(7, "mid"), (8, "after")])
def test_preemption_mid_prompt_or_after_never_duplicates_them(num_blocks: int, when: str) -> None:
    """Preempted with 16 of its 17 entries recorded (they are not recorded again), or after its
    first output (they are not sent again)."""
    engine = make_engine(num_blocks=num_blocks, block_size=4, max_num_batched_tokens=6, max_num_seqs=3)
    prompts = {"old": [3] * 5, "lp": list(range(40, 58)), "young": [4] * 5}
    engine.add_request(request("old", prompts["old"], 20))
    engine.add_request(request("lp", prompts["lp"], 10, prompt_logprobs=1))
    engine.add_request(request("young", prompts["young"], 20))
    seen: set[str] = set()

    def watch(_: int) -> None:
        req = next((r for r in engine.scheduler.waiting if r.request_id == "lp"), None)
        if req is not None and req.status == RequestStatus.PREEMPTED:
            recorded = req.prompt_logprobs
            seen.add("after" if recorded is None else "mid" if recorded else "start")

    outs = run_to_end(engine, each_step=watch)
    assert seen == {when}
    assert _carrying(outs["lp"]) == [0]
    assert outs["lp"][0].prompt_logprobs == _mock_entries(prompts["lp"], 1)
    for rid, p in prompts.items():
        assert tokens(outs[rid]) == reference_output(p, 20 if rid != "lp" else 10, vocab_size=VOCAB)


def test_a_prompt_logprobs_request_takes_no_prefix_hit_but_leaves_its_blocks() -> None:
    engine = make_engine(block_size=4)
    prompt = list(range(100, 130))
    engine.add_request(request("a", prompt, 2))
    run_to_end(engine)
    engine.add_request(request("b", prompt, 2, prompt_logprobs=0))
    b = run_to_end(engine)["b"]
    assert b[0].num_cached_tokens == 0 and b[0].prompt_logprobs == _mock_entries(prompt, 0)
    engine.add_request(request("c", prompt, 2, prompt_logprobs=0))  # a preempted or sent-out
    assert run_to_end(engine)["c"][0].num_cached_tokens == 0
    engine.add_request(request("d", prompt, 2))
    assert run_to_end(engine)["d"][0].num_cached_tokens == 28


def test_a_migrated_request_does_not_send_them_again() -> None:
    engine = make_engine()
    prompt = list(range(7, 27))
    ref = reference_output(prompt, 6, vocab_size=VOCAB)
    sampling = SamplingParams(max_tokens=6, ignore_eos=True, prompt_logprobs=2)
    engine.add_request(
        GenerateRequest(
            request_id="m", token_ids=tuple(prompt), sampling=sampling, resume_token_ids=tuple(ref[:2])
        )
    )
    outs = run_to_end(engine)["m"]
    assert tokens(outs) == ref[2:] and _carrying(outs) == []


def test_remote_kv_for_a_prompt_logprobs_request_is_refused() -> None:
    engine = make_engine()
    kt = KVTransferParams(do_remote_prefill=True, first_token_id=5)
    sampling = SamplingParams(max_tokens=4, prompt_logprobs=0)
    engine.add_request(
        GenerateRequest(request_id="r", token_ids=(1, 2, 3), sampling=sampling, kv_transfer=kt)
    )
    (out,) = engine.step().outputs
    assert out.finish_reason == "error" and out.error is not None
    assert out.error.param == "prompt_logprobs"
    assert not engine.has_unfinished()
