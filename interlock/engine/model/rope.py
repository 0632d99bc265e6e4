"""Rotary position embedding: one cos/sin table per model, applied to q and k in one pass.

The table is computed once in fp32 for every position up to the model's length. Per step the
runner looks up the rows of the batch's positions once and every layer reuses them.

Rotation uses Hugging Face's "rotate half" layout (the two halves of each head are the pair),
written as ``x * cos + roll(x, d/2) * sin_signed`` with ``sin_signed = [-sin, sin]``: four
kernels instead of the six of slice/neg/cat, and q and k are rotated together.

Scaling: ``linear`` divides positions by the factor, ``llama3`` rescales low frequencies as in
Llama 3.1. ``dynamic`` (NTK) is exact only up to ``max_position_embeddings``, where Hugging Face
leaves the frequencies unscaled; the runner caps the context there.
"""

from __future__ import annotations

import math

import torch

from interlock.engine.model.config import ModelArchConfig, RopeScaling


def inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling) -> torch.Tensor:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    if scaling.rope_type == "llama3":
        return _llama3(inv_freq, scaling)
    return inv_freq


def _llama3(inv_freq: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    old_len = s.original_max_position_embeddings
    low_freq_wavelen = old_len / s.low_freq_factor
    high_freq_wavelen = old_len / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


class RotaryTable:
    """cos and signed sin for positions ``0 .. max_len - 1``, each ``[max_len, head_dim]``."""

    def __init__(self, config: ModelArchConfig, max_len: int, device: torch.device) -> None:
        inv_freq = inverse_frequencies(config.head_dim, config.rope_theta, config.rope_scaling)
        # fp32 like Hugging Face, so the rotation matches its numerics in the exactness tests.
        inv_freq = inv_freq.to(torch.float32)
        angles = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)
        self.cos = torch.cat([angles.cos(), angles.cos()], dim=-1).to(device)
        self.sin_signed = torch.cat([-angles.sin(), angles.sin()], dim=-1).to(device)
        self.max_len = max_len

    def lookup(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows for ``positions`` ([N]), shaped ``[N, 1, head_dim]`` to broadcast over heads."""
        cos = self.cos.index_select(0, positions).to(dtype).unsqueeze(1)
        sin = self.sin_signed.index_select(0, positions).to(dtype).unsqueeze(1)
        return cos, sin


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ([N, heads, head_dim]) by the looked-up rows."""
    half = x.shape[-1] // 2
    return torch.addcmul(x * cos, torch.roll(x, half, dims=-1), sin_signed)
