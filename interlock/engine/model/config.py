"""The model's shape, read once from a Hugging Face ``config.json`` into a frozen dataclass.

Covers the Llama family (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM): the only
differences that matter to the forward pass are the q/k/v bias (Qwen2), tied embeddings and
the RoPE scaling. Both spellings of RoPE settings are accepted: transformers 5's
``rope_parameters`` and the older ``rope_theta`` + ``rope_scaling``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from interlock.errors import ConfigError

SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "llama3")


@dataclass(frozen=True)
class RopeScaling:
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class ModelArchConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    eos_token_ids: tuple[int, ...]

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_folder(cls, folder: Path) -> ModelArchConfig:
        raw = _read_json(folder / "config.json")
        generation = _read_json(folder / "generation_config.json", missing_ok=True)
        return cls.from_dict(raw, generation)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], generation: dict[str, Any] | None = None) -> ModelArchConfig:
        architecture = (raw.get("architectures") or ["LlamaForCausalLM"])[0]
        num_heads = int(raw["num_attention_heads"])
        hidden = int(raw["hidden_size"])
        config = cls(
            architecture=architecture,
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_layers=int(raw["num_hidden_layers"]),
            num_heads=num_heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or num_heads),
            head_dim=int(raw.get("head_dim") or hidden // num_heads),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=_rope_theta(raw),
            rope_scaling=_rope_scaling(raw),
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            qkv_bias=architecture == "Qwen2ForCausalLM" or bool(raw.get("attention_bias", False)),
            eos_token_ids=_eos_ids(raw, generation or {}),
        )
        config._validate()
        return config

    def _validate(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"num_attention_heads ({self.num_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ConfigError(f"head_dim must be even for RoPE, got {self.head_dim}")


def _read_json(path: Path, *, missing_ok: bool = False) -> dict[str, Any]:
    if missing_ok and not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a JSON object")
    return data


def _rope_params(raw: dict[str, Any]) -> dict[str, Any]:
    return raw.get("rope_parameters") or raw.get("rope_scaling") or {}


def _rope_theta(raw: dict[str, Any]) -> float:
    return float(_rope_params(raw).get("rope_theta") or raw.get("rope_theta") or 10000.0)


def _rope_scaling(raw: dict[str, Any]) -> RopeScaling:
    params = _rope_params(raw)
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ConfigError(
            f"RoPE scaling {rope_type!r} is not supported (supported: {', '.join(SUPPORTED_ROPE_TYPES)})"
        )
    return RopeScaling(
        rope_type=rope_type,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(
            params.get("original_max_position_embeddings") or raw.get("max_position_embeddings", 8192)
        ),
    )


def _eos_ids(raw: dict[str, Any], generation: dict[str, Any]) -> tuple[int, ...]:
    ids: list[int] = []
    for source in (generation.get("eos_token_id"), raw.get("eos_token_id")):
        for token in source if isinstance(source, list) else [source]:
            if isinstance(token, int) and token not in ids:
                ids.append(token)
    return tuple(ids)
