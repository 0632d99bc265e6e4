"""Greedy SmolLM2 outputs are token-for-token identical between aggregated and disaggregated
serving (in-process transport: real TorchRunner engines, one model's weights shared).

20 prompts, sent one at a time in the same order to a single aggregated engine and to a
prefill + decode pair: 8 share a long system prompt (prefix hits on the prefill worker), 6 are
longer than the 64-token chunked-prefill budget. fp32: in bf16 a prefill of N tokens and one of
N - k tokens after a prefix hit can round differently; here both sides compute the same chunks
in the same order, so the KV moved is bit-identical to the one the aggregated engine computes.
One torch thread everywhere (here and in worker processes): the reduction order is the same.
"""

from __future__ import annotations

import asyncio
import os

import pytest

from interlock.deploy import Routing
from interlock.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from interlock.engine.core import EngineCore
from interlock.engine.model import LlamaModel
from interlock.engine.runners.torch_runner import TorchRunner
from interlock.model_store import resolve_model
from interlock.protocol import GenerateRequest, SamplingParams
from tests.disagg.cluster import cluster, tokens

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytestmark = pytest.mark.slow

MAX_TOKENS = 8
BUDGET = 64
SYSTEM = (
    "You are a careful assistant for a hardware shop. Answer briefly, name the product family "
    "when it helps, and never invent prices. If a question is unclear, ask one question back."
)
SHORT = [
    "What is the capital of France?",
    "Name three primary colors.",
    "What is 12 times 7?",
    "Write a haiku about the sea.",
    "Explain what a CPU does.",
    "Who wrote Hamlet?",
]
SHOP = [
    "Do you sell soldering irons?",
    "Which screwdriver for laptops?",
    "Is this drill cordless?",
    "Do you have M3 screws?",
    "What glue holds metal?",
    "Can I return a saw?",
    "Which multimeter for beginners?",
    "Do you repair kettles?",
]
LONG = "Summarise the following notes in one sentence. " + " ".join(
    f"Note {k}: the {w} arrived late and the customer asked for a refund."
    for k, w in enumerate(["drill", "saw", "lamp", "kettle", "router", "cable", "vise", "clamp"])
)


def load_prompts() -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve_model("smollm2", progress=False))

    def chat(user: str, system: str | None = None) -> list[int]:
        msgs = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": user}
        ]
        ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=True)
        return list(ids["input_ids"])

    prompts = [chat(q) for q in SHORT]
    prompts += [chat(q, SYSTEM) for q in SHOP]
    prompts += [chat(LONG[: 200 + 60 * k]) for k in range(6)]
    return prompts


def engine(model: LlamaModel) -> EngineCore:
    config = EngineConfig(
        cache=CacheConfig(num_blocks=256),
        scheduler=SchedulerConfig(max_num_batched_tokens=BUDGET, max_model_len=1024),
    )
    return EngineCore(config, TorchRunner(model, num_blocks=256))


def aggregated(core: EngineCore, prompts: list[list[int]]) -> list[list[int]]:
    """One request at a time, in order (the order the disaggregated run sees them)."""
    outs = []
    for i, p in enumerate(prompts):
        params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
        core.add_request(GenerateRequest(request_id=f"a{i}", token_ids=tuple(p), sampling=params))
        got: list[int] = []
        while core.has_unfinished():
            for out in core.step().outputs:
                got += out.token_ids
        outs.append(got)
    return outs


def test_disaggregated_equals_aggregated_inproc(
    model: LlamaModel, prompts: list[list[int]], expected: list[list[int]]
) -> None:
    assert sum(len(p) > BUDGET for p in prompts) >= 6

    async def main() -> list[list[int]]:
        async with cluster(Routing(enforce_disagg=True)) as c:
            await c.add_worker("p", "prefill", engine(model))
            await c.add_worker("d", "decode", engine(model))
            await c.wait_for(2)
            got = [tokens(await c.generate(f"r{i}", p, MAX_TOKENS)) for i, p in enumerate(prompts)]
            handoff = c.workers["d"].handoff
            assert handoff is not None and handoff.counters.transports == {"inproc": len(prompts)}
            assert c.workers["p"].engine.core.pool.num_cached_blocks > 0
            return got

    got = asyncio.run(main())
    assert got == expected
