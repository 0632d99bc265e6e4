"""Batched sampling: penalties, logit bias, greedy, temperature, top-k, top-p, min-p, seeds,
min_tokens, logprobs.

One call handles every row that samples in a step, in vLLM's order:

1. ``logit_bias``, then ``repetition_penalty`` (tokens of the prompt and the output), then
   ``frequency_penalty``/``presence_penalty`` (tokens of the output), with the meanings pinned in
   ``interlock.protocol.sampling``. They change greedy rows too. Only rows that set one pay for
   it, and only at the tokens they have seen (one ``unique`` over those rows' tokens); a batch
   where none does skips the step entirely, the logits untouched.
2. Before ``min_tokens`` output tokens, stop tokens (and EOS unless ``ignore_eos``) are masked.
3. Greedy rows take the argmax; the others go through one vectorised pipeline (temperature ->
   top-k/top-p on sorted logits -> min-p -> softmax) and draw with the exponential race
   ``argmax(p / E)``, ``E ~ Exp(1)``, which picks token i with probability p_i.

Randomness (the seed contract):
- a row with a ``seed`` draws its noise from a generator seeded with
  ``mix(seed, num_output_tokens)``. The draw for the n-th output token therefore depends on the
  request alone, never on what else shares the batch, nor on whether the request was preempted
  and recomputed, nor on which process (or worker) runs it;
- unseeded rows share the sampler's generator, seeded once when the sampler is built: from the
  engine's ``seed`` when one is configured (a reproducible run of the same requests in the same
  order), else from ``os.urandom`` (the default), so two workers, or two runs, never repeat each
  other's "random" replies.

Logprobs are of the model's raw distribution (before penalties, bias, masking, temperature and
truncation), as in vLLM's default (``logprobs_mode="raw_logprobs"``). Parameters are validated at
the edge (SamplingParams.validate); here bad values are clamped to safe ones, and ``logit_bias``
ids beyond the vocabulary dropped, so that one request can never break the batch.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from interlock.protocol import SamplingParams, TokenLogprobs

_MASK = float("-inf")
LOGPROB_ROWS = 256
"""Rows per fp32 ``log_softmax`` in ``token_logprobs`` (a 49k vocabulary: 50 MB at a time)."""
_GOLDEN = 0x9E3779B97F4A7C15
_U64 = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class SamplingRow:
    params: SamplingParams
    num_output_tokens: int
    """Output tokens the request had before this one (for seeds and min_tokens)."""
    prompt_token_ids: Sequence[int] = ()
    """The request's prompt, by reference: read only for a ``repetition_penalty``."""
    output_token_ids: Sequence[int] = ()
    """Its output so far (``num_output_tokens`` long when given), by reference: read only for
    penalties."""


@dataclass(frozen=True, slots=True)
class SampleResult:
    token_ids: list[int]
    logprobs: list[TokenLogprobs | None]


def seed_for_step(seed: int, step: int) -> int:
    """A generator seed for a request's ``step``-th output token (mixed, in torch's range)."""
    return ((seed & _U64) ^ ((step + 1) * _GOLDEN)) & (_U64 >> 1)


def fresh_seed() -> int:
    """A seed from the operating system's entropy (a different one in every process)."""
    return int.from_bytes(os.urandom(8), "little")


class Sampler:
    def __init__(
        self,
        eos_token_ids: Sequence[int],
        seed: int | None = None,
        device: torch.device | None = None,
    ) -> None:
        """``seed``: of the generator unseeded rows share; None: ``fresh_seed()``."""
        self.eos_token_ids = tuple(eos_token_ids)
        self.device = device or torch.device("cpu")
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(fresh_seed() if seed is None else seed)
        self._row_generator = torch.Generator(device=self.device)

    def __call__(self, logits: torch.Tensor, rows: Sequence[SamplingRow]) -> SampleResult:
        """``logits``: fp32 ``[len(rows), vocab]``. Returns one token (and logprobs) per row."""
        raw = logits
        logits = penalize(logits, rows)
        logits = self._mask_stops(logits, rows, owned=logits is not raw)
        tokens = logits.argmax(dim=-1)
        random_rows = [i for i, row in enumerate(rows) if not row.params.greedy]
        if random_rows:
            index = torch.tensor(random_rows, device=logits.device)
            picked = self._sample(logits.index_select(0, index), [rows[i] for i in random_rows])
            tokens.index_copy_(0, index, picked)
        token_list = tokens.tolist()
        return SampleResult(token_list, _logprobs(raw, rows, token_list))

    def _mask_stops(self, logits: torch.Tensor, rows: Sequence[SamplingRow], *, owned: bool) -> torch.Tensor:
        """Before min_tokens, stop tokens may not be sampled (on a copy unless ``owned``: ``raw``
        stays intact)."""
        masked = logits
        for i, row in enumerate(rows):
            p = row.params
            if row.num_output_tokens < p.min_tokens:
                stops = set(p.stop_token_ids) | (set() if p.ignore_eos else set(self.eos_token_ids))
                ids = [t for t in stops if 0 <= t < logits.shape[-1]]
                if ids:
                    masked = logits.clone() if masked is logits and not owned else masked
                    masked[i, ids] = _MASK
        return masked

    def _sample(self, logits: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
        temps = torch.tensor([_clamp(r.params.temperature, 1e-5, 100.0) for r in rows], device=logits.device)
        logits = logits / temps.unsqueeze(1)
        logits = _top_k_top_p(logits, rows)
        probs = torch.softmax(logits, dim=-1)
        probs = _min_p(probs, rows)
        noise = self._noise(rows, probs.shape[-1])
        tokens = probs.div_(noise).argmax(dim=-1)
        # A row whose probabilities are all NaN (bad logits) falls back to its argmax.
        bad = torch.isnan(probs).all(dim=-1)
        return torch.where(bad, logits.argmax(dim=-1), tokens)

    def _noise(self, rows: Sequence[SamplingRow], vocab: int) -> torch.Tensor:
        # Exp(1) as -log(U): on CPU ``exponential_`` took ~0.85 ms per 49k-token row, rand + log
        # ~0.15 ms (8 rows: 6.7 against ~1.2 ms, a fifth of a decode step). A U of exactly 0
        # gives infinite noise, which only rules that one token out of that draw.
        noise = torch.rand(len(rows), vocab, device=self.device, generator=self.generator)
        for i, row in enumerate(rows):
            if row.params.seed is not None:
                self._row_generator.manual_seed(seed_for_step(row.params.seed, row.num_output_tokens))
                noise[i] = torch.rand(vocab, device=self.device, generator=self._row_generator)
        return noise.log_().neg_()


def _clamp(value: float, low: float, high: float, *, nan: float | None = None) -> float:
    """``value`` within [low, high]; NaN becomes ``nan`` (default: ``low``)."""
    if not (value == value):
        return low if nan is None else nan
    return min(max(value, low), high)


def penalize(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
    """``logits`` with each row's bias and penalties applied (a copy), or ``logits`` itself when
    no row sets any."""
    if not any(row.params.penalized for row in rows):
        return logits
    out = logits.clone(memory_format=torch.contiguous_format)  # the penalties index it flat
    _add_bias(out, rows)
    _repetition_penalty(out, rows)
    _frequency_presence_penalty(out, rows)
    return out


def _add_bias(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> None:
    """Add each row's ``logit_bias`` in place (ids outside the vocabulary dropped; an id given
    twice: its last bias)."""
    vocab = logits.shape[-1]
    row_ids: list[int] = []
    token_ids: list[int] = []
    biases: list[float] = []
    for i, row in enumerate(rows):
        for token_id, bias in dict(row.params.logit_bias).items():
            if 0 <= token_id < vocab:
                row_ids.append(i)
                token_ids.append(token_id)
                biases.append(_clamp(bias, -100.0, 100.0, nan=0.0))
    if row_ids:
        device = logits.device
        where = (torch.tensor(row_ids, device=device), torch.tensor(token_ids, device=device))
        logits.index_put_(where, torch.tensor(biases, dtype=logits.dtype, device=device), accumulate=True)


def _repetition_penalty(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> None:
    """In place: logits of tokens in a row's prompt or output divided by its penalty when
    positive, multiplied by it otherwise."""
    picked = [i for i, row in enumerate(rows) if row.params.repetition_penalty != 1.0]
    if not picked:
        return
    history = [(i, rows[i].prompt_token_ids) for i in picked] + [
        (i, rows[i].output_token_ids) for i in picked
    ]
    seen = _flat_ids(history, logits).unique()
    penalty = _per_row([_clamp(r.params.repetition_penalty, 1e-4, 1e4, nan=1.0) for r in rows], logits)
    flat = logits.view(-1)
    values, factor = flat[seen], penalty[seen // logits.shape[-1]]
    flat[seen] = torch.where(values > 0, values / factor, values * factor)


def _frequency_presence_penalty(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> None:
    """In place: ``frequency * count + presence * (count > 0)`` off each token's logit, ``count``
    its occurrences in the row's output."""
    picked = [i for i, row in enumerate(rows) if row.params.frequency_penalty or row.params.presence_penalty]
    if not picked:
        return
    ids, counts = _flat_ids([(i, rows[i].output_token_ids) for i in picked], logits).unique(
        return_counts=True
    )
    frequency = _per_row([_clamp(r.params.frequency_penalty, -2.0, 2.0, nan=0.0) for r in rows], logits)
    presence = _per_row([_clamp(r.params.presence_penalty, -2.0, 2.0, nan=0.0) for r in rows], logits)
    row = ids // logits.shape[-1]
    flat = logits.view(-1)
    flat[ids] -= frequency[row] * counts.to(logits.dtype) + presence[row]


def _per_row(values: list[float], like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(values, dtype=like.dtype, device=like.device)


def _flat_ids(sequences: Sequence[tuple[int, Sequence[int]]], like: torch.Tensor) -> torch.Tensor:
    """The tokens of ``(row, token ids)`` pairs as indices into ``like.view(-1)``
    (``like``: ``[rows, vocab]``), ids outside the vocabulary left out. Penalties touch only these
    positions (after ``unique``): dense ``[rows, vocab]`` counts cost a pass over every logit per
    operation (8 rows, 49k vocabulary, 2,000-token prompts, one CPU thread: 12.5 ms a step,
    against 3.4 ms this way)."""
    vocab = like.shape[-1]
    parts = [torch.empty(0, dtype=torch.long, device=like.device)]
    for r, seq in sequences:
        if len(seq):
            ids = torch.tensor(seq, dtype=torch.long, device=like.device)
            parts.append(ids[(ids >= 0) & (ids < vocab)] + r * vocab)
    return torch.cat(parts)


def _top_k_top_p(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
    vocab = logits.shape[-1]
    top_k = [r.params.top_k if 0 < r.params.top_k < vocab else vocab for r in rows]
    top_p = [_clamp(r.params.top_p, 1e-6, 1.0) for r in rows]
    if all(k == vocab for k in top_k) and all(p >= 1.0 for p in top_p):
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    rank = torch.arange(vocab, device=logits.device).unsqueeze(0)
    drop = rank >= torch.tensor(top_k, device=logits.device).unsqueeze(1)
    sorted_logits = sorted_logits.masked_fill(drop, _MASK)
    probs = torch.softmax(sorted_logits, dim=-1)
    # Keep the smallest prefix whose mass reaches top_p: drop a token when the mass before it
    # already does. The first token is always kept.
    mass_before = probs.cumsum(dim=-1) - probs
    drop = mass_before >= torch.tensor(top_p, device=logits.device).unsqueeze(1)
    drop[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(drop, _MASK)
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def _min_p(probs: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
    min_p = [_clamp(r.params.min_p, 0.0, 1.0) for r in rows]
    if not any(min_p):
        return probs
    threshold = probs.amax(dim=-1, keepdim=True) * torch.tensor(min_p, device=probs.device).unsqueeze(1)
    return probs.masked_fill(probs < threshold, 0.0)


def _logprobs(
    raw: torch.Tensor, rows: Sequence[SamplingRow], tokens: list[int]
) -> list[TokenLogprobs | None]:
    wanted = [i for i, row in enumerate(rows) if row.params.logprobs is not None]
    out: list[TokenLogprobs | None] = [None] * len(rows)
    if not wanted:
        return out
    logp = torch.log_softmax(raw.index_select(0, torch.tensor(wanted, device=raw.device)), dim=-1)
    top_n = max(max(0, rows[i].params.logprobs or 0) for i in wanted)
    top_values, top_ids = logp.topk(min(top_n, logp.shape[-1]), dim=-1)
    chosen = logp.gather(1, torch.tensor([[tokens[i]] for i in wanted], device=raw.device))
    for j, i in enumerate(wanted):
        n = max(0, rows[i].params.logprobs or 0)
        top = tuple(zip(top_ids[j, :n].tolist(), top_values[j, :n].tolist(), strict=True))
        out[i] = TokenLogprobs(tokens[i], float(chosen[j, 0]), top)
    return out


def token_logprobs(logits: torch.Tensor, token_ids: Sequence[int], top_n: int) -> list[TokenLogprobs]:
    """Per row i of ``logits`` (``[len(token_ids), vocab]``, raw): the logprob of ``token_ids[i]``
    and the ``top_n`` best (token, logprob), best first (prompt logprobs: the row of position p
    and prompt token p + 1). ``LOGPROB_ROWS`` rows at a time, so a long chunk never holds a
    second full-size fp32 copy of its logits."""
    top_n = min(max(0, top_n), logits.shape[-1])
    out: list[TokenLogprobs] = []
    for a in range(0, len(token_ids), LOGPROB_ROWS):
        ids = token_ids[a : a + LOGPROB_ROWS]
        logp = torch.log_softmax(logits[a : a + len(ids)].float(), dim=-1)
        index = torch.tensor(ids, dtype=torch.long, device=logp.device).unsqueeze(1)
        chosen = logp.gather(1, index).squeeze(1).tolist()
        tops: list[tuple[tuple[int, float], ...]] = [()] * len(ids)
        if top_n:
            values, top_ids = logp.topk(top_n, dim=-1)
            tops = [
                tuple(zip(i, v, strict=True)) for i, v in zip(top_ids.tolist(), values.tolist(), strict=True)
            ]
        out += [TokenLogprobs(t, lp, top) for t, lp, top in zip(ids, chosen, tops, strict=True)]
    return out
