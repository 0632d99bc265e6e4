"""The vLLM adapter's output translation (no vLLM started: small objects shaped like vLLM's)."""

from __future__ import annotations

from dataclasses import dataclass

from interlock.engine.vllm.engine import prompt_logprobs
from interlock.protocol import TokenLogprobs


@dataclass(frozen=True)
class Logprob:
    """vLLM's ``vllm.logprobs.Logprob``."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


def test_vllm_prompt_logprobs_become_ours() -> None:
    """Per position vLLM holds the prompt token (its own rank) and the top N (ranks 1..N): one
    entry fewer when the prompt token is among them."""
    prompt = [1, 10, 20, 30]
    entries = [
        None,
        {10: Logprob(-0.1, 1), 11: Logprob(-2.5, 2)},  # the prompt token is the best
        {20: Logprob(-7.0, 57), 21: Logprob(-0.2, 1), 22: Logprob(-1.9, 2)},  # far below the top
        {30: Logprob(-1.2, 2), 31: Logprob(-1.2, 1)},  # a tie: by rank
    ]
    assert prompt_logprobs(prompt, entries, 2) == (
        TokenLogprobs(10, -0.1, ((10, -0.1), (11, -2.5))),
        TokenLogprobs(20, -7.0, ((21, -0.2), (22, -1.9))),
        TokenLogprobs(30, -1.2, ((31, -1.2), (30, -1.2))),
    )


def test_zero_alternatives_and_a_one_token_prompt() -> None:
    assert prompt_logprobs([5, 6], [None, {6: Logprob(-3.0, 9)}], 0) == (TokenLogprobs(6, -3.0, ()),)
    assert prompt_logprobs([5], [None], 3) == ()
