"""A linear layer whose weight is pre-packed for oneDNN on CPU in bf16.

``F.linear`` re-lays out a bf16 weight for oneDNN's kernel on every call; packing once at load
time (what inductor's weight freezing does) halved the time of a one-row matmul and saved
10-25% at 32 rows on these CPUs, with bit-identical results. Packing is used only where it is
available and verified on a sample at load time; anything else (fp32, CUDA, a torch without
the op) falls back to ``F.linear``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class Linear:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.bias = bias
        self.packed = _pack(weight, bias)
        # Keep one copy only: the packed one replaces the plain weight.
        self.weight = weight if self.packed is None else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        assert self.weight is not None
        return F.linear(x, self.weight, self.bias)


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
