"""Synthetic prompts: input/output lengths from distributions, optional shared-prefix groups.

Prompt ``i`` is a pure function of (spec, vocab, i): lengths come from an RNG seeded with the
index, the body from deterministic blocks. With ``prefix_groups = G`` and ``prefix_len = P``,
request ``i`` starts with group ``i % G``'s P-token prefix (the same ids for every member),
followed by its own tokens, so a prefix cache on the server sees G shared prefixes.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from interlock.bench.lengths import LengthDist
from interlock.bench.vocab import Vocab
from interlock.errors import ConfigError


@dataclass(frozen=True)
class Prompt:
    text: str
    token_ids: tuple[int, ...] | None
    """Exact ids when a tokenizer built the prompt (for ``prompt`` as a list of ids)."""
    input_tokens: int
    """Intended prompt length (exact with a tokenizer, approximate without)."""
    max_tokens: int


@dataclass(frozen=True)
class SyntheticSpec:
    input_len: LengthDist
    output_len: LengthDist
    prefix_len: int = 0
    prefix_groups: int = 0
    seed: int = 0

    def validate(self) -> None:
        if self.prefix_len < 0 or self.prefix_groups < 0:
            raise ConfigError("prefix length and groups must be >= 0")
        if (self.prefix_len > 0) != (self.prefix_groups > 0):
            raise ConfigError("shared prefixes need both --prefix-len and --prefix-groups")


def make_prompt(ids: list[int], vocab: Vocab, max_tokens: int) -> Prompt:
    return Prompt(
        text=vocab.text(ids),
        token_ids=tuple(ids) if vocab.exact else None,
        input_tokens=len(ids),
        max_tokens=max_tokens,
    )


def synthetic_prompt(spec: SyntheticSpec, vocab: Vocab, index: int) -> Prompt:
    rng = random.Random(f"{spec.seed}:lengths:{index}")
    input_len = spec.input_len.sample(rng)
    output_len = spec.output_len.sample(rng)
    ids: list[int] = []
    if spec.prefix_groups:
        group = index % spec.prefix_groups
        ids = vocab.block(f"prefix:{spec.seed}:{group}", min(spec.prefix_len, input_len))
    ids += vocab.block(f"unique:{spec.seed}:{index}", input_len - len(ids))
    return make_prompt(ids, vocab, output_len)
