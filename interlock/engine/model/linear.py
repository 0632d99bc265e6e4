"""A linear layer whose weight is pre-packed once, for the fastest CPU kernel available.

Three ways, chosen at load time:

* ``cpu_ops.linear_small`` (bf16, CPU with AVX-512 BF16, weight shape [16a, 2b]): weights
  packed as 16 output features side by side in input-feature pairs (see ``csrc/cpu_ops.cpp``).
  On this machine it was 1.5-3x faster than oneDNN for the few rows of a decode step and
  as fast at 512 rows, for the layers' weights. Not for the output head: at 49,152 features
  oneDNN stayed ahead from 8 rows up, so the model asks for it with ``fused=False``.
* oneDNN with the weight re-laid out once (what inductor's weight freezing does):
  ``F.linear`` re-lays out a bf16 weight on every call; packing once halved the time of a
  one-row matmul and saved 10-25% at 32 rows, bit-identical. Verified on a sample at load.
* ``F.linear`` for everything else (fp32, CUDA, a torch without the op).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from interlock.engine.model import cpu_ops


class Linear:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, *, fused: bool = True) -> None:
        self.bias = bias
        self.ops: Any = _fused_ops(weight) if fused else None
        self.small = None if self.ops is None else self.ops.pack_linear_weight(weight)
        self.packed = None if self.small is not None else _pack(weight, bias)
        # Keep one copy only: a packed one replaces the plain weight.
        self.weight = weight if self.packed is None and self.small is None else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.small is not None and x.is_contiguous():
            return self.ops.linear_small(x, self.small, self.bias)  # type: ignore[no-any-return]
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        return F.linear(x, self.plain_weight(), self.bias)

    def plain_weight(self) -> torch.Tensor:
        if self.weight is not None:
            return self.weight
        assert self.small is not None, "oneDNN-packed weights are only used through the packed op"
        # [N/16, K/2, 16] dwords -> [N, K] bf16 (a rare path: non-contiguous input).
        blocks, pairs, _ = self.small.shape
        return self.small.permute(0, 2, 1).reshape(blocks * 16, pairs).contiguous().view(torch.bfloat16)


def _fused_ops(weight: torch.Tensor) -> Any:
    if weight.device.type != "cpu" or weight.dtype != torch.bfloat16:
        return None
    if weight.dim() != 2 or weight.shape[0] % 16 or weight.shape[1] % 2:
        return None
    return cpu_ops.load()


def _pack(weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    if weight.device.type != "cpu" or weight.dtype != torch.bfloat16:
        return None
    if not torch.backends.mkldnn.is_available():
        return None
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, 32)
        sample = torch.randn(3, weight.shape[1], dtype=weight.dtype)
        got = torch.ops.mkldnn._linear_pointwise(sample, packed, bias, "none", [], "")
    except (RuntimeError, AttributeError):
        return None
    return packed if torch.equal(got, F.linear(sample, weight, bias)) else None
