"""A linear layer whose weight is packed once for each kernel it may use, chosen per row count.

Three kernels (``LINEAR_IMPLS``); which one serves a call depends on the call's number of rows,
by the layer's ``Plan`` (measured on this machine, see ``kernel_choice`` and ``dispatch``):

* ``small``: ``linear_small`` of the model dtype's fused library. bf16 (CPU with AVX-512 BF16,
  weight shape [16a, 2b]): weights packed as 16 output features side by side in input-feature
  pairs (see ``csrc/cpu_ops.cpp``); on an AMD Zen it was 1.5-3x faster than oneDNN for the few
  rows of a decode step and as fast at 512 rows. fp32 (AVX2 + FMA, weight shape [8a, b], every
  weight a bf16 value, as a bf16 checkpoint loaded in fp32 is): the weights kept as bf16, 8
  output features side by side (``csrc/cpu_ops_f32.cpp``), widened exactly to fp32 in registers:
  half the bytes a decode step streams, the same products as ``F.linear`` on the fp32 weight.
* ``onednn``: oneDNN with the weight re-laid out once (what inductor's weight freezing does):
  ``F.linear`` re-lays out a bf16 weight on every call; packing once halved the time of a
  one-row matmul and saved 10-25% at 32 rows, bit-identical. Verified on a sample at load. On a
  CPU with AMX this is the kernel that uses the tiles. fp32 weights (``dtype`` auto on a CPU
  without fast bf16) are packed too, equal to ``F.linear`` within rounding: on an AMD Zen 3 the
  model's 120 linear layers, weights streamed from memory, took 1.12-1.49x less time packed
  than through ``F.linear`` at 1 to 256 rows (``benchmarks/linear_packing.py``).
* ``torch``: ``F.linear`` on the plain weight (also what fp16, CUDA, or a missing op get).

Without a plan a layer uses ``small`` where it can, else ``onednn``, else ``torch``. A layer
keeps only the packings its plan uses (two when it switches kernels between row ranges).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F

from interlock.engine.model import cpu_ops
from interlock.engine.model.kernel_choice import Plan, random

LINEAR_IMPLS = ("small", "onednn", "torch")


class Linear:
    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        *,
        fused: bool = True,
        plan: Plan | None = None,
    ) -> None:
        self.bias = bias
        self.ops: Any = _fused_ops(weight) if fused else None
        if plan is None:
            plan = Plan.only("small" if self.ops is not None else "onednn")
        used = plan.used
        self.small = (
            self.ops.pack_linear_weight(weight.to(torch.bfloat16).contiguous())
            if self.ops is not None and "small" in used
            else None
        )
        self.packed = (
            _pack(weight, bias) if "onednn" in used or self.small is None and "small" in used else None
        )
        # The plain weight only where a call may need it: the plan says torch, or a packing failed.
        needs_plain = "torch" in used or (self.small is None and self.packed is None)
        self.weight = weight if needs_plain else None
        self.plan = plan
        self._rows = -1
        self._fn: Callable[[torch.Tensor], torch.Tensor] = self._torch

    def tensors(self) -> list[torch.Tensor]:
        """What this layer holds: each layout its kernels keep, and the bias."""
        return [t for t in (self.small, self.packed, self.weight, self.bias) if t is not None]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        if rows != self._rows:
            self._fn = self._kernel(self.plan.impl_for(rows))
            self._rows = rows
        return self._fn(x)

    def kernel_for(self, rows: int) -> str:
        """The kernel that actually serves ``rows`` rows here (after fallbacks)."""
        fn = self._kernel(self.plan.impl_for(rows))
        names: dict[object, str] = {self._small: "small", self._onednn: "onednn"}
        return names.get(fn, "torch")

    def _kernel(self, impl: str) -> Callable[[torch.Tensor], torch.Tensor]:
        if impl == "small" and self.small is not None:
            return self._small
        if impl in ("small", "onednn") and self.packed is not None:
            return self._onednn
        if self.small is not None and self.weight is None and self.packed is None:
            return self._small
        return self._torch

    def _small(self, x: torch.Tensor) -> torch.Tensor:
        if not x.is_contiguous():
            return self._torch(x)
        return self.ops.linear_small(x, self.small, self.bias)  # type: ignore[no-any-return]

    def _onednn(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def _torch(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.plain_weight(), self.bias)

    def plain_weight(self) -> torch.Tensor:
        if self.weight is not None:
            return self.weight
        assert self.small is not None, "oneDNN-packed weights are only used through the packed op"
        if self.small.dtype == torch.bfloat16:  # fp32's packing: [N/8, K, 8] bf16 -> [N, K] fp32
            blocks, inputs, _ = self.small.shape
            return self.small.permute(0, 2, 1).reshape(blocks * 8, inputs).float()
        # [N/16, K/2, 16] dwords -> [N, K] bf16 (a rare path: non-contiguous input).
        blocks, pairs, _ = self.small.shape
        return self.small.permute(0, 2, 1).reshape(blocks * 16, pairs).contiguous().view(torch.bfloat16)


def linear_calls(
    shape: tuple[int, int], dtype: torch.dtype = torch.bfloat16
) -> Callable[[int], Mapping[str, Callable[[], object]]]:
    """For a row count, each kernel usable here on a random weight of ``shape`` (bf16 values,
    in ``dtype``), as a call on a random input (what ``kernel_choice`` times). The weight is
    made and packed at the first call only: a start that finds its table cached pays nothing."""

    @functools.cache
    def usable() -> dict[str, Linear]:
        weight = random(*shape, scale=0.02).to(dtype)
        layers = {impl: Linear(weight, fused=True, plan=Plan.only(impl)) for impl in LINEAR_IMPLS}
        return {impl: lin for impl, lin in layers.items() if lin.kernel_for(1) == impl}

    def calls(rows: int) -> Mapping[str, Callable[[], object]]:
        x = random(rows, shape[1], dtype=dtype)
        return {impl: functools.partial(lin, x) for impl, lin in usable().items()}

    return calls


def _fused_ops(weight: torch.Tensor) -> Any:
    if weight.device.type != "cpu" or weight.dim() != 2:
        return None
    if weight.dtype == torch.bfloat16:
        return None if weight.shape[0] % 16 or weight.shape[1] % 2 else cpu_ops.load()
    if weight.dtype == torch.float32 and weight.shape[0] % 8 == 0 and _bf16_values(weight):
        return cpu_ops.load_f32()
    return None


def _bf16_values(weight: torch.Tensor) -> bool:
    """Whether every fp32 weight is a bf16 value (its low 16 bits zero): then keeping it as
    bf16 loses nothing. True for a bf16 checkpoint loaded in fp32; an fp32 or fp16 one is not."""
    return not bool(torch.bitwise_and(weight.view(torch.int32), 0xFFFF).any())


def _pack(weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    if weight.device.type != "cpu" or weight.dtype not in (torch.bfloat16, torch.float32):
        return None
    if not torch.backends.mkldnn.is_available():
        return None
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, 32)
        sample = torch.randn(3, weight.shape[1], dtype=weight.dtype)
        got = torch.ops.mkldnn._linear_pointwise(sample, packed, bias, "none", [], "")
    except (RuntimeError, AttributeError):
        return None
    want = F.linear(sample, weight, bias)
    if weight.dtype == torch.float32:  # another summation order: equal to rounding, not to the bit
        return packed if torch.allclose(got, want, rtol=1e-4, atol=1e-5) else None
    return packed if torch.equal(got, want) else None
