"""The Llama-family forward pass in plain PyTorch, over a flat batch of tokens.

All tokens of a step (decode tokens of many requests and prefill chunks) go through the
linear layers as one ``[num_tokens, hidden]`` matrix; only attention looks at requests (see
``attention.py``). Logits are computed for the rows that sample only: for a 512-token prompt
that skips 511 rows of the largest matmul.

The per-layer Python is kept to a straight line of large kernels (fused QKV, fused gate/up,
one rotary call for q and k together) because on two CPU cores the per-kernel overhead across
30 layers is what limits decode at large batch.

On a CPU with fused kernels for the model's dtype (``cpu_ops``: bf16 with AVX-512 BF16, fp32
with AVX2 + FMA), each layer is seven calls: four linear layers and three fused kernels:
residual add + RMSNorm, rotary + KV store, paged flash attention over the cache for every kind
of chunk, and SwiGLU. Each of them is one of several implementations, chosen per size by
measurement on this machine (``dispatch``): a prefill chunk may go to PyTorch's attention where
oneDNN's matmuls (AMX) beat the fused kernel, say. Elsewhere (fp16, CUDA, a CPU without those
instructions) the plain PyTorch path below computes the same function.

One rank of a tensor x pipeline group (``partition``) is the same class over its share: its
config is the local one (its heads, features and layers), and ``reduce`` adds up the partial
outputs of o and down across the stage's ranks before each residual add. ``forward`` is
``embed``, ``layers`` and ``logits`` in a row; a group calls them one by one (under its own
inference mode: ``Stage.run``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from interlock.deploy import DEFAULT_MAX_NUM_BATCHED_TOKENS
from interlock.engine.model import cpu_ops
from interlock.engine.model.attention import (
    AttentionMetadata,
    decode_attention,
    prefill_attention,
    write_kv,
)
from interlock.engine.model.config import ModelArchConfig
from interlock.engine.model.dispatch import (
    AttentionRoute,
    ElementwisePlans,
    TorchKernels,
    attend,
    fused_layers_usable,
    kernel_table,
)
from interlock.engine.model.kernel_choice import KernelTable
from interlock.engine.model.kv_cache import PagedKVCache
from interlock.engine.model.partition import RankShard
from interlock.engine.model.rope import RotaryTable, apply_rotary
from interlock.engine.model.weights import LayerWeights, ModelWeights, load_weights


class LlamaModel:
    def __init__(
        self,
        config: ModelArchConfig,
        weights: ModelWeights,
        max_len: int,
        device: torch.device,
        *,
        fused: bool = True,
        table: KernelTable | None = None,
    ) -> None:
        self.config = config
        self.weights = weights
        self.dtype = weights.embed.dtype
        self.device = device
        self.rope = RotaryTable(config, max_len, device)
        self.ops = self._fused_ops() if fused else None
        self.table = table
        self.route = AttentionRoute.from_table(table, config)
        self.elementwise = ElementwisePlans.from_table(table, config)
        self.reduce: Callable[[torch.Tensor], torch.Tensor] | None = None
        """Adds a row-parallel layer's partial sums across the stage (None: one rank)."""

    @classmethod
    def load(
        cls,
        folder: Path,
        dtype: torch.dtype,
        device: torch.device,
        max_len: int | None = None,
        *,
        fused: bool = True,
        kernels: dict[str, str] | None = None,
        max_rows: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
        shard: RankShard | None = None,
    ) -> LlamaModel:
        """``fused=False``: the plain PyTorch path even where the fused CPU kernels run.

        ``kernels``: per family (linear, attention, elementwise) "auto" (the default) picks each
        operation's kernel per size by measurement on this machine (``dispatch``; measured once
        for up to ``max_rows`` rows, then cached); a kernel name forces it everywhere (tests,
        comparisons; ``INTERLOCK_<FAMILY>_KERNEL``). ``shard``: one rank's share (None: all)."""
        config = ModelArchConfig.from_folder(folder)
        local = shard.local_config(config) if shard is not None else config
        table = kernel_table(local, dtype, device, fused=fused, kernels=kernels or {}, max_rows=max_rows)
        weights = load_weights(folder, config, dtype, device, fused=fused, table=table, shard=shard)
        return cls(
            local, weights, max_len or config.max_position_embeddings, device, fused=fused, table=table
        )

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        cache: PagedKVCache,
        logits_indices: torch.Tensor,
    ) -> torch.Tensor:
        """Run the step's tokens; return fp32 logits ``[len(logits_indices), vocab]``."""
        h = self.layers(self.embed(input_ids), positions, meta, cache)
        return self.logits(h.index_select(0, logits_indices))

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.weights.embed)

    def layers(
        self, h: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, cache: PagedKVCache
    ) -> torch.Tensor:
        """The hidden states ``h`` through this model's layers (the residual stream after them)."""
        if meta.seq_info is not None:
            assert self.fused_attention(cache.block_size), "fused metadata for a model without the kernels"
            return self._fused_layers(h, positions, meta, cache) if h.shape[0] else h
        cos, sin = self.rope.lookup(positions, self.dtype)
        for i, layer in enumerate(self.weights.layers):
            x = self._norm(h, layer.input_norm)
            h = h + self._sum(self._attention(x, layer, cos, sin, meta, cache.slots[i], cache.blocks[i]))
            x = self._norm(h, layer.post_norm)
            h = h + self._sum(self._mlp(x, layer))
        return h

    def logits(self, last: torch.Tensor) -> torch.Tensor:
        """fp32 logits of the residual stream's rows ``last`` (the driver only)."""
        assert self.weights.lm_head is not None, "only the driver rank holds the output head"
        if not last.shape[0]:
            return torch.empty(0, self.config.vocab_size, device=self.device)
        return self.weights.lm_head(self._norm(last, self.weights.norm)).float()

    def _sum(self, partial: torch.Tensor) -> torch.Tensor:
        return partial if self.reduce is None else self.reduce(partial)

    def fused_attention(self, block_size: int) -> bool:
        """Whether steps over a cache of ``block_size`` run the fused kernels (then
        ``build_input(..., fused=True)``)."""
        return self.ops is not None and block_size % 16 == 0

    def _fused_ops(self) -> object | None:
        usable = self.device.type == "cpu" and fused_layers_usable(self.config)
        return cpu_ops.ops_for(self.dtype) if usable else None

    def _fused_layers(
        self, h: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, cache: PagedKVCache
    ) -> torch.Tensor:
        c = self.config
        eps = c.rms_norm_eps
        layers = self.weights.layers
        if self.route is not None:
            meta = self.route.split(meta, cache.block_size)
        k = self.elementwise.kernels(self.ops, h.shape[0])
        x = k.rms_norm(h, layers[0].input_norm, eps)
        for i, layer in enumerate(layers):
            qkv = layer.qkv(x)
            k.rope_write_kv(
                qkv,
                positions,
                self.rope.cos,
                self.rope.sin_signed,
                cache.slots[i],
                meta.slot_mapping,
                c.num_heads,
                c.num_kv_heads,
            )
            attn = attend(self.ops, qkv, meta, cache.blocks[i], c)
            x = k.add_rms_norm(h, self._sum(layer.o(attn)), layer.post_norm, eps)
            delta = self._sum(layer.down(k.silu_mul(layer.gate_up(x))))
            if i + 1 < len(layers):
                x = k.add_rms_norm(h, delta, layers[i + 1].input_norm, eps)
            else:
                h.add_(delta)
        return h

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        # Hugging Face's exact recipe (fp32 statistics, cast, then scale), so bf16 rounds as
        # transformers does. F.rms_norm was up to 4x slower on 512 rows here.
        return TorchKernels.rms_norm(x, weight, self.config.rms_norm_eps)

    def _attention(
        self,
        x: torch.Tensor,
        layer: LayerWeights,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: AttentionMetadata,
        slots: torch.Tensor,
        blocks: torch.Tensor,
    ) -> torch.Tensor:
        c = self.config
        n = x.shape[0]
        qkv = layer.qkv(x)
        qk = apply_rotary(qkv[:, : c.q_size + c.kv_size].view(n, -1, c.head_dim), cos, sin)
        q, k = qk[:, : c.num_heads], qk[:, c.num_heads :]
        v = qkv[:, c.q_size + c.kv_size :].view(n, c.num_kv_heads, c.head_dim)
        write_kv(slots, k, v, meta.slot_mapping)
        parts = []
        if meta.num_decode:
            parts.append(decode_attention(q[: meta.num_decode], blocks, meta))
        for span in meta.prefills:
            rows = slice(span.start, span.end)
            parts.append(prefill_attention(q[rows], k[rows], v[rows], blocks, span))
        attn = parts[0] if len(parts) == 1 else torch.cat(parts)
        return layer.o(attn)

    def _mlp(self, x: torch.Tensor, layer: LayerWeights) -> torch.Tensor:
        return layer.down(TorchKernels.silu_mul(layer.gate_up(x)))
