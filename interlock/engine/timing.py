"""Step-time model of a simulated engine (pure functions).

The default follows the published polynomial fit of Dynamo's mocker, so that simulations here
are comparable with Dynamo's:

  prefill_ms(T) = 4.209989e-7 * T^2 + 1.518344e-2 * T + 16.50142    T = batch tokens not cached
  decode_ms(u)  = max(1, -25.74 * u^2 + 54.01 * u + 5.74)            u = active KV / total KV

A step with both prefill chunks and decodes costs the sum of the two terms (a mixed batch does
both kinds of work); everything is divided by ``speedup``.
"""

from __future__ import annotations

from dataclasses import dataclass


def prefill_ms(num_tokens: int) -> float:
    t = float(num_tokens)
    return 4.209989e-7 * t * t + 1.518344e-2 * t + 16.50142


def decode_ms(kv_usage: float) -> float:
    u = kv_usage
    return max(1.0, -25.74 * u * u + 54.01 * u + 5.74)


@dataclass(frozen=True, slots=True)
class TimingModel:
    speedup: float = 1.0
    """Divides every modelled time (Dynamo's ``--speedup-ratio``)."""

    def __post_init__(self) -> None:
        if self.speedup <= 0:
            raise ValueError("speedup must be positive")

    def step_s(self, prefill_tokens: int, num_decodes: int, kv_usage: float) -> float:
        """Seconds for one step with ``prefill_tokens`` uncached prompt tokens and
        ``num_decodes`` decoding requests, at KV usage ``kv_usage`` (0..1)."""
        ms = 0.0
        if prefill_tokens > 0:
            ms += prefill_ms(prefill_tokens)
        if num_decodes > 0:
            ms += decode_ms(kv_usage)
        return ms / self.speedup / 1000.0
