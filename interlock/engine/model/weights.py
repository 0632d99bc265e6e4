"""Load a Llama-family checkpoint from safetensors into fused, ready-to-multiply tensors.

Fusions done once here so that every step runs fewer, larger matmuls:

* q, k and v projections -> one ``qkv`` weight (and bias for Qwen2);
* gate and up projections -> one ``gate_up`` weight;
* the attention scale 1/sqrt(head_dim) is folded into the q rows, so attention never
  multiplies scores (exact in bf16 when head_dim is a power of four, e.g. 64).

Tied embeddings share one tensor between the embedding and the output head.

A rank of a tensor x pipeline group (``partition.RankShard``) loads only its share: its layers,
and in each the rows of q, k, v, gate and up and the columns of o and down of its heads and
features; the embedding on the first stage only, the final norm and output head on the
driver only (elsewhere they are empty).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from interlock.engine.model.config import ModelArchConfig
from interlock.engine.model.dispatch import linear_key
from interlock.engine.model.kernel_choice import KernelTable, Plan
from interlock.engine.model.linear import Linear
from interlock.engine.model.partition import RankShard, partition
from interlock.errors import ConfigError


@dataclass(frozen=True)
class LayerWeights:
    input_norm: torch.Tensor
    qkv: Linear
    """[q_size + 2 * kv_size, hidden] (+ bias for Qwen2); q rows pre-scaled by 1/sqrt(head_dim)."""
    o: Linear
    post_norm: torch.Tensor
    gate_up: Linear
    """[2 * intermediate, hidden]: gate rows first, then up rows."""
    down: Linear


@dataclass(frozen=True)
class ModelWeights:
    embed: torch.Tensor
    """[vocab, hidden]; [0, hidden] on a rank that embeds nothing (a later pipeline stage)."""
    layers: tuple[LayerWeights, ...]
    norm: torch.Tensor
    lm_head: Linear | None
    """None on a rank that computes no logits (every rank of a group but the driver)."""

    @property
    def nbytes(self) -> int:
        """Bytes these weights hold in memory: every layout their kernels keep
        (``Linear.tensors``; a oneDNN-packed one at its logical size), a tensor shared (a tied
        head's plain weight is the embedding) counted once."""
        tensors = [self.embed, self.norm, *(self.lm_head.tensors() if self.lm_head is not None else ())]
        for layer in self.layers:
            tensors += [layer.input_norm, layer.post_norm]
            for linear in (layer.qkv, layer.o, layer.gate_up, layer.down):
                tensors += linear.tensors()
        seen: dict[int, int] = {}
        for t in tensors:
            key = id(t) if t.is_mkldnn else t.data_ptr()
            seen[key] = max(seen.get(key, 0), t.numel() * t.element_size())
        return sum(seen.values())


class _Checkpoint:
    """All tensors of a folder's ``*.safetensors`` files, read lazily by name."""

    def __init__(self, folder: Path) -> None:
        self._where: dict[str, Path] = {}
        for file in sorted(folder.glob("*.safetensors")):
            with safe_open(str(file), framework="pt") as fh:
                self._where.update(dict.fromkeys(fh.keys(), file))
        if not self._where:
            raise ConfigError(f"{folder} has no *.safetensors weights")

    def has(self, name: str) -> bool:
        return name in self._where

    def get(self, name: str, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        if name not in self._where:
            raise ConfigError(f"checkpoint has no tensor {name!r}")
        with safe_open(str(self._where[name]), framework="pt") as fh:
            return fh.get_tensor(name).to(device=device, dtype=dtype).contiguous()


def load_weights(
    folder: Path,
    config: ModelArchConfig,
    dtype: torch.dtype,
    device: torch.device,
    *,
    fused: bool = True,
    table: KernelTable | None = None,
    shard: RankShard | None = None,
) -> ModelWeights:
    """``fused=False`` keeps every linear layer off the fused CPU kernels (tests compare);
    ``table`` gives each layer weight's kernel per row count (None: the default choice);
    ``shard``: one rank's share of the full model ``config`` (None: all of it)."""
    ckpt = _Checkpoint(folder)
    cut = shard or partition(config, 1, 1)[0]
    embed = (
        ckpt.get("model.embed_tokens.weight", dtype, device)
        if cut.first_stage  # the driver is on the first stage: its (tied) head has the weight
        else torch.empty(0, config.hidden_size, dtype=dtype, device=device)
    )
    lm_head = None
    if cut.driver:
        tied = config.tie_word_embeddings or not ckpt.has("lm_head.weight")
        lm_head = _head(embed if tied else ckpt.get("lm_head.weight", dtype, device), fused, table)
    return ModelWeights(
        embed=embed,
        layers=tuple(_layer(ckpt, config, i, dtype, device, fused, table, cut) for i in cut.layers),
        norm=ckpt.get("model.norm.weight", dtype, device) if cut.driver else torch.empty(0, dtype=dtype),
        lm_head=lm_head,
    )


def _head(weight: torch.Tensor, fused: bool, table: KernelTable | None) -> Linear:
    # oneDNN unless measured otherwise: it was as fast as the small kernel at 49,152 features
    # on a Zen 5, and the small kernel's packing is a second copy of the (tied) embedding.
    plan = table.plan(linear_key((weight.shape[0], weight.shape[1]))) if table is not None else None
    return Linear(weight, fused=fused, plan=plan or Plan.only("onednn"))


def _layer(
    ckpt: _Checkpoint,
    config: ModelArchConfig,
    i: int,
    dtype: torch.dtype,
    device: torch.device,
    fused: bool,
    table: KernelTable | None,
    cut: RankShard,
) -> LayerWeights:
    p = f"model.layers.{i}."
    d = config.head_dim
    q_rows = slice(cut.q_heads.start * d, cut.q_heads.stop * d)
    kv_rows = slice(cut.kv_heads.start * d, cut.kv_heads.stop * d)
    features = slice(cut.intermediate.start, cut.intermediate.stop)

    def get(name: str, rows: slice = slice(None), columns: slice = slice(None)) -> torch.Tensor:
        # fp32 while fusing so that the q scaling rounds once, at the final cast.
        whole = ckpt.get(p + name, torch.float32, device)
        return whole[rows, columns] if whole.dim() == 2 else whole[rows]

    scale = 1.0 / math.sqrt(config.head_dim)
    qkv = torch.cat(
        [
            get("self_attn.q_proj.weight", q_rows) * scale,
            get("self_attn.k_proj.weight", kv_rows),
            get("self_attn.v_proj.weight", kv_rows),
        ]
    )
    bias = None
    if config.qkv_bias:
        bias = torch.cat(
            [
                get("self_attn.q_proj.bias", q_rows) * scale,
                get("self_attn.k_proj.bias", kv_rows),
                get("self_attn.v_proj.bias", kv_rows),
            ]
        ).to(dtype)
    gate_up = torch.cat([get("mlp.gate_proj.weight", features), get("mlp.up_proj.weight", features)])

    def linear(weight: torch.Tensor, b: torch.Tensor | None = None) -> Linear:
        plan = table.plan(linear_key((weight.shape[0], weight.shape[1]))) if table is not None else None
        return Linear(weight, b, fused=fused, plan=plan)

    return LayerWeights(
        input_norm=get("input_layernorm.weight").to(dtype),
        qkv=linear(qkv.to(dtype).contiguous(), bias),
        o=linear(get("self_attn.o_proj.weight", slice(None), q_rows).to(dtype).contiguous()),
        post_norm=get("post_attention_layernorm.weight").to(dtype),
        gate_up=linear(gate_up.to(dtype).contiguous()),
        down=linear(get("mlp.down_proj.weight", slice(None), features).to(dtype).contiguous()),
    )
