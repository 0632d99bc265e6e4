"""Sampler: greedy, seeds independent of the batch, top-k/top-p/min-p masks, logprobs."""

from __future__ import annotations

import math

import pytest
import torch

from interlock.engine.sampler import Sampler, SamplingRow
from interlock.protocol import SamplingParams

VOCAB = 50


def _logits(rows: int = 1, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed))


def _row(step: int = 0, **params: object) -> SamplingRow:
    return SamplingRow(SamplingParams(**params), step)  # type: ignore[arg-type]


def _draws(logits: torch.Tensor, n: int = 400, **params: object) -> set[int]:
    sampler = Sampler(eos_token_ids=(), seed=1)
    return {sampler(logits, [_row(**params)]).token_ids[0] for _ in range(n)}


def test_greedy_takes_the_argmax() -> None:
    logits = _logits(3)
    result = Sampler(eos_token_ids=())(logits, [_row(temperature=0.0)] * 3)
    assert result.token_ids == logits.argmax(-1).tolist()
    assert result.logprobs == [None, None, None]


def test_seeded_rows_do_not_depend_on_the_batch() -> None:
    logits = _logits(4)
    seeded = _row(step=7, temperature=1.0, seed=1234)
    alone = Sampler((), seed=0)(logits[2:3], [seeded]).token_ids[0]
    others = [_row(temperature=1.0), _row(temperature=0.0), seeded, _row(temperature=0.7, seed=5)]
    in_batch = Sampler((), seed=99)(logits, others).token_ids[2]
    assert alone == in_batch


def test_seed_gives_different_tokens_at_different_steps() -> None:
    logits = torch.zeros(1, VOCAB)  # uniform: any token may come
    sampler = Sampler(())
    tokens = {sampler(logits, [_row(step=s, seed=42)]).token_ids[0] for s in range(20)}
    assert len(tokens) > 5


def test_sampling_follows_the_distribution() -> None:
    logits = torch.full((1, VOCAB), -30.0)
    logits[0, 3], logits[0, 9] = math.log(0.75), math.log(0.25)
    sampler = Sampler((), seed=3)
    draws = [sampler(logits, [_row()]).token_ids[0] for _ in range(2000)]
    assert set(draws) == {3, 9}
    assert 0.70 < draws.count(3) / len(draws) < 0.80


def test_top_k_keeps_the_k_best() -> None:
    logits = _logits()
    best = set(logits[0].topk(3).indices.tolist())
    assert _draws(logits, top_k=3, temperature=5.0) == best


def test_top_p_keeps_the_smallest_prefix_reaching_p() -> None:
    logits = torch.full((1, VOCAB), -30.0)
    logits[0, :4] = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    assert _draws(logits, top_p=0.7) == {0, 1}
    assert _draws(logits, top_p=0.5) == {0}
    assert _draws(logits, top_p=0.81) == {0, 1, 2}


def test_min_p_drops_tokens_below_a_fraction_of_the_best() -> None:
    logits = torch.full((1, VOCAB), -30.0)
    logits[0, :3] = torch.log(torch.tensor([0.6, 0.3, 0.1]))
    assert _draws(logits, min_p=0.4) == {0, 1}


def test_min_tokens_masks_stop_tokens() -> None:
    logits = torch.zeros(1, VOCAB)
    logits[0, 2] = 100.0  # eos would win
    logits[0, 7] = 50.0
    sampler = Sampler(eos_token_ids=(2,))
    assert sampler(logits, [_row(temperature=0.0, min_tokens=3)]).token_ids == [7]
    assert sampler(logits, [_row(step=3, temperature=0.0, min_tokens=3)]).token_ids == [2]
    stop = _row(temperature=0.0, min_tokens=2, ignore_eos=True, stop_token_ids=(7,))
    assert sampler(logits, [stop]).token_ids == [2]


def test_logprobs_of_the_raw_distribution() -> None:
    logits = _logits(2)
    result = Sampler(())(logits, [_row(temperature=0.0, logprobs=3), _row(temperature=0.0)])
    expected = torch.log_softmax(logits[0], -1)
    lp = result.logprobs[0]
    assert lp is not None and result.logprobs[1] is None
    assert lp.token_id == result.token_ids[0]
    assert lp.logprob == pytest.approx(float(expected.max()), abs=1e-5)
    assert [t for t, _ in lp.top] == expected.topk(3).indices.tolist()
    zero = Sampler(())(logits[:1], [_row(temperature=0.0, logprobs=0)]).logprobs[0]
    assert zero is not None and zero.top == ()


def test_bad_values_never_break_the_batch() -> None:
    logits = _logits(4)
    rows = [
        _row(temperature=float("nan")),
        _row(top_p=0.0, top_k=-5, min_p=3.0),
        _row(temperature=-1.0),
        _row(temperature=1.0, seed=-(2**63)),
    ]
    result = Sampler(())(logits, rows)
    assert len(result.token_ids) == 4
    assert result.token_ids[0] == int(logits[0].argmax())
    assert all(0 <= t < VOCAB for t in result.token_ids)
