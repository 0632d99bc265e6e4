"""Load a Llama-family checkpoint from safetensors into fused, ready-to-multiply tensors.

Fusions done once here so that every step runs fewer, larger matmuls:

* q, k and v projections -> one ``qkv`` weight (and bias for Qwen2);
* gate and up projections -> one ``gate_up`` weight;
* the attention scale 1/sqrt(head_dim) is folded into the q rows, so attention never
  multiplies scores (exact in bf16 when head_dim is a power of four, e.g. 64).

Tied embeddings share one tensor between the embedding and the output head.
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
    layers: tuple[LayerWeights, ...]
    norm: torch.Tensor
    lm_head: Linear


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
) -> ModelWeights:
    """``fused=False`` keeps every linear layer off the fused CPU kernels (tests compare);
    ``table`` gives each layer weight's kernel per row count (None: the default choice)."""
    ckpt = _Checkpoint(folder)
    embed = ckpt.get("model.embed_tokens.weight", dtype, device)
    tied = config.tie_word_embeddings or not ckpt.has("lm_head.weight")
    return ModelWeights(
        embed=embed,
        layers=tuple(_layer(ckpt, config, i, dtype, device, fused, table) for i in range(config.num_layers)),
        norm=ckpt.get("model.norm.weight", dtype, device),
        lm_head=_head(embed if tied else ckpt.get("lm_head.weight", dtype, device), fused, table),
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
) -> LayerWeights:
    p = f"model.layers.{i}."

    def get(name: str) -> torch.Tensor:
        # fp32 while fusing so that the q scaling rounds once, at the final cast.
        return ckpt.get(p + name, torch.float32, device)

    scale = 1.0 / math.sqrt(config.head_dim)
    qkv = torch.cat(
        [
            get("self_attn.q_proj.weight") * scale,
            get("self_attn.k_proj.weight"),
            get("self_attn.v_proj.weight"),
        ]
    )
    bias = None
    if config.qkv_bias:
        bias = torch.cat(
            [get("self_attn.q_proj.bias") * scale, get("self_attn.k_proj.bias"), get("self_attn.v_proj.bias")]
        ).to(dtype)
    gate_up = torch.cat([get("mlp.gate_proj.weight"), get("mlp.up_proj.weight")])

    def linear(weight: torch.Tensor, b: torch.Tensor | None = None) -> Linear:
        plan = table.plan(linear_key((weight.shape[0], weight.shape[1]))) if table is not None else None
        return Linear(weight, b, fused=fused, plan=plan)

    return LayerWeights(
        input_norm=get("input_layernorm.weight").to(dtype),
        qkv=linear(qkv.to(dtype).contiguous(), bias),
        o=linear(get("self_attn.o_proj.weight").to(dtype)),
        post_norm=get("post_attention_layernorm.weight").to(dtype),
        gate_up=linear(gate_up.to(dtype).contiguous()),
        down=linear(get("mlp.down_proj.weight").to(dtype)),
    )
