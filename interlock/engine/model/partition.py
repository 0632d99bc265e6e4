"""How a model is cut into the ranks of a tensor x pipeline group (pure: shapes in, slices out).

A group of ``T x P`` ranks runs one model: rank ``r`` is pipeline stage ``r // T`` and tensor
rank ``r % T``. Rank 0 is the worker process itself (the driver: scheduler, sampler, KV block
table); it is stage 0 and also holds the output head, so every step's logits come out where
the sampler is.

Pipeline: stage ``s`` runs a contiguous range of layers, split as evenly as the layer count
allows (the first stages take one more where it does not divide).

Tensor (Megatron's cut): q, k and v are column-parallel by attention head, o row-parallel by
the same heads; gate and up column-parallel by intermediate feature, down row-parallel by the
same features; the outputs of o and down are partial sums, added up across the stage's ranks
(an all-reduce) before the residual. The embedding and norms are replicated. Heads are cut
on KV-group boundaries so that every rank keeps the model's own q-per-KV ratio:

* ``T <= kv_heads``: each rank takes a contiguous run of KV heads (uneven where ``T`` does not
  divide them: SmolLM2-135M's 3 KV heads over 2 ranks are 1 + 2, the lighter share to rank 0,
  which also builds the inputs and samples) and the q heads of those groups;
* ``T > kv_heads``: each KV head is replicated on ``T / kv_heads`` ranks (balanced where it
  does not divide) and its group's q heads are split among them; each rank then holds one
  KV head and all its q heads read it (``T <= heads`` leaves every rank a q head).

The intermediate features are split evenly in multiples of 16 where the size allows (the
packed CPU kernels want rows in sixteens), else as evenly as possible.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from interlock.engine.model.config import ModelArchConfig
from interlock.errors import ConfigError

MAX_RANKS = 64
"""Ranks of one group at most (T x P)."""


@dataclass(frozen=True, slots=True)
class RankShard:
    """What one rank holds: ranges of the full model's heads, features and layers."""

    rank: int
    tensor_rank: int
    stage: int
    tensor_size: int
    pipeline_size: int
    q_heads: range
    kv_heads: range
    intermediate: range
    layers: range

    @property
    def world(self) -> int:
        return self.tensor_size * self.pipeline_size

    @property
    def first_stage(self) -> bool:
        return self.stage == 0

    @property
    def last_stage(self) -> bool:
        return self.stage == self.pipeline_size - 1

    @property
    def driver(self) -> bool:
        return self.rank == 0

    def local_config(self, config: ModelArchConfig) -> ModelArchConfig:
        """``config`` as this rank sees it: its heads, features and layers only (vocabulary,
        head size, norms and RoPE unchanged)."""
        return dataclasses.replace(
            config,
            num_heads=len(self.q_heads),
            num_kv_heads=len(self.kv_heads),
            intermediate_size=len(self.intermediate),
            num_layers=len(self.layers),
        )


def check_sizes(config: ModelArchConfig, tensor: int, pipeline: int) -> str:
    """Why ``config`` cannot be cut into ``tensor x pipeline`` ranks ("": it can)."""
    if tensor < 1 or pipeline < 1:
        return "tensor_parallel_size and pipeline_parallel_size must be >= 1"
    if tensor * pipeline > MAX_RANKS:
        return f"{tensor} x {pipeline} ranks: at most {MAX_RANKS} in one group"
    if pipeline > config.num_layers:
        return f"pipeline_parallel_size {pipeline} exceeds the model's {config.num_layers} layers"
    if tensor > config.num_heads:
        return f"tensor_parallel_size {tensor} exceeds the model's {config.num_heads} attention heads"
    if tensor > config.intermediate_size:
        return f"tensor_parallel_size {tensor} exceeds the model's {config.intermediate_size} MLP features"
    return ""


def partition(config: ModelArchConfig, tensor: int, pipeline: int) -> tuple[RankShard, ...]:
    """Every rank's share of ``config``, rank order. ConfigError where it cannot be cut."""
    why = check_sizes(config, tensor, pipeline)
    if why:
        raise ConfigError(why)
    layer_cuts = _even(config.num_layers, pipeline)
    heads = _head_cuts(config, tensor)
    features = _feature_cuts(config.intermediate_size, tensor)
    return tuple(
        RankShard(
            rank=s * tensor + t,
            tensor_rank=t,
            stage=s,
            tensor_size=tensor,
            pipeline_size=pipeline,
            q_heads=heads[t][0],
            kv_heads=heads[t][1],
            intermediate=features[t],
            layers=layer_cuts[s],
        )
        for s in range(pipeline)
        for t in range(tensor)
    )


def _even(n: int, parts: int, *, unit: int = 1, light_first: bool = False) -> list[range]:
    """``range(n)`` cut into ``parts`` contiguous runs, sizes multiples of ``unit`` (the last
    takes the remainder) and as even as that allows; the first runs take the extra units, or
    the last ones (``light_first``)."""
    units, rest = divmod(n, unit)
    base, extra = divmod(units, parts)
    cuts, start = [], 0
    for i in range(parts):
        heavy = i >= parts - extra if light_first else i < extra
        size = (base + heavy) * unit + (rest if i == parts - 1 else 0)
        cuts.append(range(start, start + size))
        start += size
    return cuts


def _feature_cuts(n: int, parts: int) -> list[range]:
    cuts = _even(n, parts, unit=16)
    if all(len(c) for c in cuts):
        return cuts
    return _even(n, parts)


def _head_cuts(config: ModelArchConfig, tensor: int) -> list[tuple[range, range]]:
    group = config.num_heads // config.num_kv_heads
    if tensor <= config.num_kv_heads:
        # The driver (rank 0) also builds inputs and samples: it takes the lighter share.
        runs = _even(config.num_kv_heads, tensor, light_first=True)
        return [(range(kv.start * group, kv.stop * group), kv) for kv in runs]
    cuts = []
    for kv, ranks in enumerate(_even(tensor, config.num_kv_heads)):
        for q in _even(group, len(ranks)):
            cuts.append((range(kv * group + q.start, kv * group + q.stop), range(kv, kv + 1)))
    return cuts
