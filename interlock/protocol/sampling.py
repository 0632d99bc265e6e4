"""Per-request sampling parameters (wire type).

Every field has vLLM's (and, where OpenAI has it, OpenAI's) meaning, so a request means the same
on Interlock's engine and on vLLM's. Penalties and ``logit_bias`` apply in vLLM's order, to the
logits of greedy and random rows alike (``engine.sampler``):

1. ``logit_bias``: ``bias`` added to the logit of each listed token id;
2. ``repetition_penalty`` p: for each token present in the prompt or the output so far, a
   positive logit is divided by p, any other multiplied by p;
3. ``frequency_penalty`` f and ``presence_penalty`` r: ``f * count + r * (count > 0)``
   subtracted from the logit of each token, ``count`` its occurrences in the output so far.

Output tokens include those a migrated request carries (``GenerateRequest.resume_token_ids``).
Token ids of ``logit_bias`` are checked against the model's vocabulary where it is known (the
frontend); the engine drops an id beyond its vocabulary rather than fail the batch.
"""

from __future__ import annotations

import math

import msgspec

from interlock.errors import InvalidRequest

MAX_TOP_LOGPROBS = 20
MIN_SEED, MAX_SEED = -(2**63), 2**64 - 1  # what an int64 or uint64 seed can hold
MAX_PENALTY = 2.0
"""presence_penalty and frequency_penalty lie in [-MAX_PENALTY, MAX_PENALTY] (OpenAI, vLLM)."""
MAX_LOGIT_BIAS = 100.0
"""A logit_bias lies in [-MAX_LOGIT_BIAS, MAX_LOGIT_BIAS] (OpenAI)."""
STRUCTURED_KINDS = ("json_schema", "json_object", "regex", "choice", "grammar")


class StructuredOutput(msgspec.Struct, frozen=True):
    """A constraint on the whole output (enforced by the engine's grammar, or vLLM's)."""

    kind: str
    """One of ``STRUCTURED_KINDS``."""
    spec: str = ""
    """json_schema: the schema as JSON text; regex: the pattern; choice: a JSON list of the
    allowed strings; grammar: an EBNF grammar; json_object: "" (any JSON object)."""


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
    presence_penalty: float = 0.0
    """In [-2, 2]: subtracted once from the logit of every token already in the output."""
    frequency_penalty: float = 0.0
    """In [-2, 2]: subtracted from a token's logit once per time it is in the output."""
    repetition_penalty: float = 1.0
    """> 0 (1: none): logits of tokens in the prompt or the output divided by it when positive,
    multiplied by it otherwise."""
    logit_bias: tuple[tuple[int, float], ...] = ()
    """(token id, bias in [-100, 100]) pairs, each id once: the bias is added to its logit."""
    structured: StructuredOutput | None = None
    """A constraint on the output (``response_format``, or vLLM's structured outputs)."""
    prompt_logprobs: int | None = None
    """None: none. N >= 0 (vLLM's meaning): for every prompt token after the first, its logprob
    given the tokens before it, plus the top N alternatives at that position
    (``GenerateOutput.prompt_logprobs``). Such a request computes its whole prompt: no prefix
    cache hit, no KV from another worker."""

    @property
    def greedy(self) -> bool:
        """Sample the most likely token (a temperature of ~0; NaN counts as greedy)."""
        return not self.temperature > 1e-5

    @property
    def penalized(self) -> bool:
        """Some penalty or bias changes this request's logits."""
        return bool(
            self.logit_bias
            or self.repetition_penalty != 1.0
            or self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
        )

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
        if self.prompt_logprobs is not None and not (0 <= self.prompt_logprobs <= MAX_TOP_LOGPROBS):
            raise InvalidRequest(
                f"prompt_logprobs must be between 0 and {MAX_TOP_LOGPROBS}", param="prompt_logprobs"
            )
        if self.seed is not None and not (MIN_SEED <= self.seed <= MAX_SEED):
            raise InvalidRequest("seed out of range", param="seed")
        self._validate_penalties()
        if self.structured is not None and self.structured.kind not in STRUCTURED_KINDS:
            raise InvalidRequest(
                f"response_format type {self.structured.kind!r} is not supported "
                f"(one of {', '.join(STRUCTURED_KINDS)})",
                param="response_format",
            )

    def _validate_penalties(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            if not (-MAX_PENALTY <= getattr(self, name) <= MAX_PENALTY):
                raise InvalidRequest(f"{name} must be between -2 and 2", param=name)
        if not (0.0 < self.repetition_penalty < math.inf):
            raise InvalidRequest("repetition_penalty must be greater than 0", param="repetition_penalty")
        seen: set[int] = set()
        for token_id, bias in self.logit_bias:
            if token_id < 0:
                raise InvalidRequest(f"logit_bias token id {token_id} is negative", param="logit_bias")
            if token_id in seen:
                raise InvalidRequest(f"logit_bias names token id {token_id} twice", param="logit_bias")
            if not (-MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS):
                raise InvalidRequest(
                    f"logit_bias of token {token_id} must be between -100 and 100", param="logit_bias"
                )
            seen.add(token_id)
