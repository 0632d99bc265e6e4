"""The paged KV cache: one tensor ``[layers, 2, kv_heads, num_blocks, block_size, head_dim]``.

Why this order: decode attention gathers each request's blocks with one index on the block
axis, and with kv_heads in front of it the gathered tensor is already
``[2, kv_heads, batch, tokens, head_dim]``, the layout the grouped matmul wants, with no copy.
A token's slot is ``block * block_size + offset``, so writes are one ``index_copy_`` per layer
on a ``[2, kv_heads, num_blocks * block_size, head_dim]`` view.

Export format (what another runner of the same model imports): blocks one after another, each
``[layers, 2, kv_heads, block_size, head_dim]`` in the cache dtype, ``block_nbytes`` bytes.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch

from interlock.engine.model.config import ModelArchConfig


def block_nbytes(config: ModelArchConfig, block_size: int, dtype: torch.dtype) -> int:
    elem = torch.empty((), dtype=dtype).element_size()
    return config.num_layers * 2 * config.num_kv_heads * block_size * config.head_dim * elem


def blocks_for_budget(config: ModelArchConfig, block_size: int, dtype: torch.dtype, gib: float) -> int:
    return max(2, int(gib * (1 << 30)) // block_nbytes(config, block_size, dtype))


class PagedKVCache:
    def __init__(
        self,
        config: ModelArchConfig,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.dtype = dtype
        self.block_nbytes = block_nbytes(config, block_size, dtype)
        shape = (config.num_layers, 2, config.num_kv_heads, num_blocks, block_size, config.head_dim)
        self.tensor = torch.zeros(shape, dtype=dtype, device=device)
        # Per-layer views, built once: blocks for gathering, flat slots for writing.
        self.blocks = [self.tensor[i] for i in range(config.num_layers)]
        flat = (2, config.num_kv_heads, num_blocks * block_size, config.head_dim)
        self.slots = [layer.view(flat) for layer in self.blocks]

    def export_blocks(self, block_ids: Sequence[int], out: memoryview) -> None:
        ids = self._ids(block_ids)
        dest = self._byte_view(out, len(block_ids))
        # [L, 2, H, n, bs, D] -> [n, L, 2, H, bs, D]: one block after another.
        dest.copy_(self.tensor.index_select(3, ids).permute(3, 0, 1, 2, 4, 5).cpu())

    def import_blocks(self, block_ids: Sequence[int], data: memoryview) -> None:
        ids = self._ids(block_ids)
        src = self._byte_view(data, len(block_ids)).to(self.tensor.device)
        self.tensor.index_copy_(3, ids, src.permute(1, 2, 3, 0, 4, 5))

    def _ids(self, block_ids: Sequence[int]) -> torch.Tensor:
        ids = torch.tensor(list(block_ids), dtype=torch.long, device=self.tensor.device)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.num_blocks):
            raise IndexError(f"block ids out of range [0, {self.num_blocks})")
        return ids

    def _byte_view(self, buffer: memoryview, num_blocks: int) -> torch.Tensor:
        expected = num_blocks * self.block_nbytes
        if buffer.nbytes != expected:
            raise ValueError(f"buffer holds {buffer.nbytes} bytes, {num_blocks} blocks need {expected}")
        _, two, heads, _, bs, dim = self.tensor.shape
        layers = self.tensor.shape[0]
        if not expected:
            flat = torch.empty(0, dtype=torch.uint8)
        else:
            with warnings.catch_warnings():
                # Imports read from a read-only buffer; the tensor is never written then.
                warnings.simplefilter("ignore", UserWarning)
                flat = torch.frombuffer(buffer, dtype=torch.uint8)
        return flat.view(self.dtype).view(num_blocks, layers, two, heads, bs, dim)
