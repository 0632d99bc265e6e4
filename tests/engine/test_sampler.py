"""Sampler: greedy, seeds independent of the batch, top-k/top-p/min-p masks, logprobs, penalties
and logit bias, fresh randomness."""

from __future__ import annotations

import math

import pytest
import torch

from interlock.engine.sampler import Sampler, SamplingRow, penalize
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


# ---- penalties and logit bias (vLLM's meaning, interlock.protocol.sampling) ----


def _hist(prompt: tuple[int, ...] = (), output: tuple[int, ...] = (), **params: object) -> SamplingRow:
    return SamplingRow(SamplingParams(**params), len(output), prompt, output)  # type: ignore[arg-type]


def test_frequency_penalty_takes_its_value_per_occurrence_in_the_output() -> None:
    logits = _logits()
    out = penalize(logits, [_hist(prompt=(7, 7), output=(3, 3, 3, 5), frequency_penalty=0.5)])
    expected = logits.clone()
    expected[0, 3] -= 1.5
    expected[0, 5] -= 0.5
    assert torch.equal(out, expected)  # the prompt's token 7 is not counted


def test_presence_penalty_takes_its_value_once_per_token_in_the_output() -> None:
    logits = _logits()
    out = penalize(logits, [_hist(output=(3, 3, 3, 5), presence_penalty=0.25, frequency_penalty=-1.0)])
    expected = logits.clone()
    expected[0, 3] -= -3.0 + 0.25
    expected[0, 5] -= -1.0 + 0.25
    assert torch.equal(out, expected)


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits() -> None:
    logits = torch.zeros(1, VOCAB)
    logits[0, 1], logits[0, 2], logits[0, 4], logits[0, 6], logits[0, 8] = 2.0, -2.0, 3.0, 5.0, -1.0
    out = penalize(logits, [_hist(prompt=(1, 2, 0), output=(4,), repetition_penalty=2.0)])
    expected = logits.clone()
    expected[0, 1], expected[0, 2], expected[0, 4] = 1.0, -4.0, 1.5  # 6 and 8 were never seen
    assert torch.equal(out, expected)


def test_penalties_apply_in_vllms_order() -> None:
    """Bias, then repetition, then frequency: 1 + 1 -> /2 -> 1.0 (not 1/2 + 1), and
    -1 -> *2 -> -1 -> -3.0 (not (-1 - 1) * 2)."""
    logits = torch.zeros(1, VOCAB)
    logits[0, 3], logits[0, 4] = 1.0, -1.0
    row = _hist(output=(3, 4), logit_bias=((3, 1.0),), repetition_penalty=2.0, frequency_penalty=1.0)
    out = penalize(logits, [row])
    assert (float(out[0, 3]), float(out[0, 4])) == (0.0, -3.0)


def test_logit_bias_forces_or_bans_a_token_under_greedy() -> None:
    logits = _logits()
    best, second = logits[0].topk(2).indices.tolist()
    sampler = Sampler(())
    assert sampler(logits, [_row(temperature=0.0, logit_bias=((17, 100.0),))]).token_ids == [17]
    assert sampler(logits, [_row(temperature=0.0, logit_bias=((best, -100.0),))]).token_ids == [second]
    assert _draws(logits, logit_bias=((best, -100.0),), n=200).isdisjoint({best})


def test_a_greedy_repeat_gives_way_to_a_frequency_penalty() -> None:
    logits = torch.zeros(1, VOCAB)
    logits[0, 5], logits[0, 9] = 3.0, 2.0
    sampler = Sampler(())
    plain = _hist(output=(5, 5), temperature=0.0)
    assert sampler(logits, [plain]).token_ids == [5]
    assert sampler(logits, [_hist(output=(5, 5), temperature=0.0, frequency_penalty=0.6)]).token_ids == [9]
    assert sampler(logits, [_hist(output=(5, 5), temperature=0.0, frequency_penalty=0.4)]).token_ids == [5]


def test_neutral_rows_cost_nothing_and_keep_their_logits() -> None:
    logits = _logits(3)
    rows = [_hist(prompt=(1, 2), output=(3,)), _row(temperature=0.0), _row(seed=3)]
    assert penalize(logits, rows) is logits  # no copy, no counting
    mixed = rows + [_hist(prompt=(1, 2), output=(3,), repetition_penalty=1.5, presence_penalty=1.0)]
    out = penalize(torch.cat([logits, _logits(1, seed=9)]), mixed)
    assert torch.equal(out[:3], logits)


def test_plain_rows_sample_the_same_beside_penalized_ones() -> None:
    logits = _logits(4)
    plain = [_row(temperature=0.0), _row(step=2, temperature=0.8, seed=11)]
    alone = Sampler((), seed=5)(logits[:2], plain).token_ids
    penalized = [
        _hist(prompt=(1, 2), output=tuple(range(20)), repetition_penalty=1.7, temperature=0.0),
        _hist(output=(4, 4), frequency_penalty=2.0, logit_bias=((0, 50.0),), seed=11),
    ]
    mixed = Sampler((), seed=77)(logits, [*plain, *penalized]).token_ids
    assert mixed[:2] == alone


def test_seeded_penalized_rows_do_not_depend_on_the_batch() -> None:
    logits = _logits(3)
    row = _hist(prompt=(1, 2, 3), output=(4, 4, 9), seed=123, repetition_penalty=1.3, presence_penalty=0.7)
    alone = Sampler((), seed=0)(logits[1:2], [row]).token_ids[0]
    others = [_row(temperature=1.0), row, _hist(output=(1,), frequency_penalty=1.0)]
    assert Sampler((), seed=42)(logits, others).token_ids[1] == alone


def test_logprobs_stay_of_the_raw_distribution_under_penalties() -> None:
    logits = _logits()
    raw = logits.clone()
    row = _hist(prompt=(1,), output=(2,), temperature=0.0, logprobs=2, logit_bias=((9, 100.0),), min_tokens=5)
    result = Sampler(eos_token_ids=(9,))(logits, [row])
    lp = result.logprobs[0]
    assert lp is not None and lp.token_id == result.token_ids[0] != 9  # eos is masked despite the bias
    assert lp.logprob == pytest.approx(float(torch.log_softmax(raw[0], -1)[lp.token_id]), abs=1e-6)
    assert torch.equal(logits, raw)  # the caller's logits are never written


def test_bad_penalties_never_break_the_batch() -> None:
    logits = _logits(4)
    rows = [
        _hist(output=(3, VOCAB + 4, -2), repetition_penalty=float("nan"), frequency_penalty=float("inf")),
        _hist(prompt=(VOCAB, 1), repetition_penalty=0.0, presence_penalty=float("nan")),
        _row(temperature=0.0, logit_bias=((VOCAB + 1, 5.0), (3, float("nan")), (4, 1e9))),
        _hist(output=(1,), temperature=0.0, repetition_penalty=-3.0),
    ]
    result = Sampler(())(logits, rows)
    assert all(0 <= t < VOCAB for t in result.token_ids)
    assert torch.isfinite(penalize(logits, rows)).all()


# ---- the sampler's own randomness ----


def test_unseeded_samplers_draw_fresh_randomness() -> None:
    logits = torch.zeros(1, VOCAB)
    runs = [[s(logits, [_row()]).token_ids[0] for _ in range(30)] for s in (Sampler(()), Sampler(()))]
    assert runs[0] != runs[1]


def test_an_engine_seed_makes_unseeded_draws_reproducible() -> None:
    logits = torch.zeros(1, VOCAB)
    runs = [[s(logits, [_row()]).token_ids[0] for _ in range(30)] for s in (Sampler((), 9), Sampler((), 9))]
    assert runs[0] == runs[1]
