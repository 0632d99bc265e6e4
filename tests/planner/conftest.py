from __future__ import annotations

from interlock.engine.timing import TimingModel
from interlock.planner import CapabilityProfile, DecodePoint, PrefillPoint


def mock_profile(kv_tokens: int = 61_000 * 64, chunk: int = 8192) -> CapabilityProfile:
    """The capability of a mock-timed worker, straight from its step-time model."""
    t = TimingModel()
    prefill = tuple(PrefillPoint(n, t.step_s(n, 0, 0.0)) for n in (256, 1024, 2048, 4096, 8192))
    decode = tuple(
        DecodePoint(b, ctx, t.step_s(0, b, b * ctx / kv_tokens))
        for b in (1, 4, 16, 64, 256)
        for ctx in (1024, 4096, 16384)
    )
    return CapabilityProfile("mock", "mock", chunk, 256, kv_tokens, prefill, decode)
