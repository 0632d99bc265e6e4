"""What the placement optimizer plans over: a model's shape, the devices, the traffic.

Pure values. ``ModelShape.from_hf_config`` reads a Hugging Face ``config.json`` (already parsed:
a mapping) into the few numbers the cost model needs; it counts parameters from the shapes
(embeddings, attention, MLP or experts, norms), so a 70B model can be planned from its config
alone, with no weights. Dense Llama-family models and mixture-of-experts models in Mixtral's
(``num_local_experts``) or Qwen-MoE's (``num_experts``, ``moe_intermediate_size``, an optional
shared expert) spelling are read; latent attention (DeepSeek's MLA) is refused, its KV per token
is not the GQA formula.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from interlock.deploy import DEFAULT_MAX_NUM_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS

GIB = 1 << 30
DTYPE_BYTES = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0, "float8_e4m3fn": 1.0}


@dataclass(frozen=True, slots=True)
class ModelShape:
    """The numbers of one model that decide how it is cut and how fast it runs."""

    parameters: int
    """Every weight, embeddings and every expert included."""
    layers: int
    hidden: int
    intermediate: int
    """The config's ``intermediate_size`` (for Mixtral, one expert's width)."""
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    context_length: int
    """Tokens of one sequence at most: the KV one sequence may need."""
    bytes_per_param: float = 2.0
    kv_bytes_per_token: int = 0
    """K and V of every layer for one token; 0: ``2 x layers x kv_heads x head_dim x activation_bytes``."""
    activation_bytes: int = 2
    """Bytes of one hidden-state element (all-reduces, stage hops) and of one KV element."""
    experts: int = 0
    """Routed experts per layer; 0: a dense model."""
    active_experts: int = 0
    """Experts each token goes through."""
    expert_intermediate: int = 0
    name: str = ""

    def __post_init__(self) -> None:
        sizes = (self.parameters, self.layers, self.hidden, self.heads, self.kv_heads, self.head_dim)
        if min(sizes) < 1 or self.vocab < 1 or self.context_length < 1 or self.bytes_per_param <= 0:
            raise ValueError("a model's sizes must be positive")
        if self.experts and not (1 <= self.active_experts <= self.experts and self.expert_intermediate > 0):
            raise ValueError("a mixture of experts needs 1 <= active_experts <= experts and their width")
        if not self.kv_bytes_per_token:
            kv = 2 * self.layers * self.kv_heads * self.head_dim * self.activation_bytes
            object.__setattr__(self, "kv_bytes_per_token", kv)

    @property
    def weight_bytes(self) -> float:
        return self.parameters * self.bytes_per_param

    @property
    def expert_parameters(self) -> int:
        """The routed experts' weights (gate, up, down of each), all layers."""
        return self.layers * self.experts * 3 * self.hidden * self.expert_intermediate

    @property
    def active_parameters(self) -> float:
        """Weights one token computes with: the dense part and its experts' share."""
        if not self.experts:
            return float(self.parameters)
        return self.parameters - self.expert_parameters * (1 - self.active_experts / self.experts)

    def bytes_read(self, tokens: float) -> float:
        """Weight bytes one pass over ``tokens`` tokens reads: every dense weight, and the experts
        at least one token was routed to (routing taken as uniform and independent)."""
        if not self.experts:
            return self.weight_bytes
        touched = 1 - (1 - self.active_experts / self.experts) ** max(tokens, 1.0)
        return (self.parameters - self.expert_parameters * (1 - touched)) * self.bytes_per_param

    @classmethod
    def from_hf_config(cls, raw: Mapping[str, Any], *, name: str = "") -> ModelShape:
        """A Hugging Face ``config.json``'s shape (see the module note for what is read)."""
        if raw.get("kv_lora_rank"):
            raise ValueError("latent attention (kv_lora_rank, DeepSeek's MLA) is not modelled")
        hidden, layers = int(raw["hidden_size"]), int(raw["num_hidden_layers"])
        heads = int(raw["num_attention_heads"])
        kv_heads = int(raw.get("num_key_value_heads") or heads)
        head_dim = int(raw.get("head_dim") or hidden // heads)
        experts = int(raw.get("num_local_experts") or raw.get("num_experts") or 0)
        expert_width = int(raw.get("moe_intermediate_size") or raw["intermediate_size"]) if experts else 0
        attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
        mlp = _mlp_parameters(raw, hidden, experts, expert_width)
        embeddings = int(raw["vocab_size"]) * hidden * (1 if raw.get("tie_word_embeddings") else 2)
        dtype = str(raw.get("torch_dtype") or raw.get("dtype") or "bfloat16")
        return cls(
            parameters=embeddings + layers * (attention + mlp + 2 * hidden) + hidden,
            layers=layers,
            hidden=hidden,
            intermediate=int(raw["intermediate_size"]),
            heads=heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            vocab=int(raw["vocab_size"]),
            context_length=int(raw.get("max_position_embeddings") or 2048),
            bytes_per_param=DTYPE_BYTES.get(dtype, 2.0),
            activation_bytes=4 if dtype == "float32" else 2,
            experts=experts,
            active_experts=int(raw.get("num_experts_per_tok") or 0) if experts else 0,
            expert_intermediate=expert_width,
            name=name,
        )


def _mlp_parameters(raw: Mapping[str, Any], hidden: int, experts: int, expert_width: int) -> int:
    if not experts:
        return 3 * hidden * int(raw["intermediate_size"])
    shared = int(raw.get("shared_expert_intermediate_size") or 0)
    return experts * 3 * hidden * expert_width + hidden * experts + 3 * hidden * shared


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    """One accelerator (or, on a CPU, one core with its share of the host's memory)."""

    memory_bytes: int
    flops: float
    """Dense FLOP/s at the weights' precision."""
    memory_bandwidth: float
    """Bytes/s from its memory."""
    name: str = "device"

    def __post_init__(self) -> None:
        if self.memory_bytes <= 0 or self.flops <= 0 or self.memory_bandwidth <= 0:
            raise ValueError("a device's memory, FLOP/s and bandwidth must be positive")


@dataclass(frozen=True, slots=True)
class Cluster:
    """``devices`` equal devices, ``devices_per_host`` to a host; links inside a host and between."""

    device: DeviceSpec
    devices: int
    devices_per_host: int
    link_bandwidth: float
    """Bytes/s between two devices of one host (one direction)."""
    link_latency_s: float
    """One collective's fixed cost inside a host (launch and synchronisation)."""
    inter_host_bandwidth: float
    inter_host_latency_s: float
    headroom: float = 0.1
    """Fraction of each device's memory kept free (activations, runtime): vLLM's 0.9 utilisation."""
    assumed: tuple[str, ...] = ()
    """What was assumed rather than given or measured, one line each (shown with the plan)."""

    def __post_init__(self) -> None:
        if self.devices < 1 or self.devices_per_host < 1:
            raise ValueError("a cluster needs at least one device and one device per host")
        if min(self.link_bandwidth, self.inter_host_bandwidth) <= 0 or not 0 <= self.headroom < 1:
            raise ValueError("link bandwidths must be positive and headroom in [0, 1)")

    @property
    def hosts(self) -> int:
        return math.ceil(self.devices / self.devices_per_host)

    def link(self, span: int) -> tuple[float, float]:
        """Bandwidth and latency among ``span`` devices of one group: a host's link while they
        fit in one host, else the inter-host one (the slowest hop sets the pace)."""
        if span <= self.devices_per_host:
            return self.link_bandwidth, self.link_latency_s
        return self.inter_host_bandwidth, self.inter_host_latency_s

    def groups(self, size: int) -> int:
        """How many groups of ``size`` devices the cluster holds: within hosts while a group
        fits in one (a host's leftover devices are not joined with another's), else across."""
        if size > self.devices_per_host:
            return self.devices // size
        full, rest = divmod(self.devices, self.devices_per_host)
        return full * (self.devices_per_host // size) + rest // size


@dataclass(frozen=True, slots=True)
class Workload:
    """The mean request, and the batch limits each replica runs under."""

    prompt_tokens: int = 1024
    output_tokens: int = 256
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    """Sequences one replica runs at once at most (Interlock's default; vLLM's is 256)."""
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    """Tokens of one step at most: prefill goes in chunks of this (Interlock's default)."""

    def __post_init__(self) -> None:
        if min(self.prompt_tokens, self.output_tokens, self.max_num_seqs, self.max_num_batched_tokens) < 1:
            raise ValueError("a workload's token counts and limits must be >= 1")

    @property
    def sequence_tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens


__all__ = ["DTYPE_BYTES", "GIB", "Cluster", "DeviceSpec", "ModelShape", "Workload"]
