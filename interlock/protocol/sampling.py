"""Per-request sampling parameters (wire type)."""

from __future__ import annotations

import msgspec

from interlock.errors import InvalidRequest

MAX_TOP_LOGPROBS = 20
MIN_SEED, MAX_SEED = -(2**63), 2**64 - 1  # what an int64 or uint64 seed can hold


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True):
    max_tokens: int = 16
    temperature: float = 1.0
    """0 means greedy."""
    top_p: float = 1.0
    top_k: int = 0
    """0 (or -1) disables top-k."""
    min_p: float = 0.0
    seed: int | None = None
    """Makes sampling reproducible for this request, independent of batching."""
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: int | None = None
    """None: no logprobs. N >= 0: the sampled token's logprob plus the top N alternatives."""

    @property
    def greedy(self) -> bool:
        """Sample the most likely token (a temperature of ~0; NaN counts as greedy)."""
        return not self.temperature > 1e-5

    def validate(self) -> None:
        """Raise InvalidRequest naming the first bad field."""
        if self.max_tokens < 1:
            raise InvalidRequest("max_tokens must be at least 1", param="max_tokens")
        if not (0.0 <= self.temperature <= 100.0):
            raise InvalidRequest("temperature must be between 0 and 100", param="temperature")
        if not (0.0 < self.top_p <= 1.0):
            raise InvalidRequest("top_p must be in (0, 1]", param="top_p")
        if self.top_k < -1:
            raise InvalidRequest("top_k must be -1, 0 or positive", param="top_k")
        if not (0.0 <= self.min_p <= 1.0):
            raise InvalidRequest("min_p must be in [0, 1]", param="min_p")
        if self.min_tokens < 0 or self.min_tokens > self.max_tokens:
            raise InvalidRequest("min_tokens must be in [0, max_tokens]", param="min_tokens")
        if self.logprobs is not None and not (0 <= self.logprobs <= MAX_TOP_LOGPROBS):
            raise InvalidRequest(
                f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}", param="top_logprobs"
            )
        if self.seed is not None and not (MIN_SEED <= self.seed <= MAX_SEED):
            raise InvalidRequest("seed out of range", param="seed")
