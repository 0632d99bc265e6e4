"""Interlock's ``SamplingParams`` onto vLLM's, field by field (pure: tested without vLLM).

Every field maps to vLLM's field of the same meaning (``interlock.protocol.sampling``). A
migrated request continues after ``done`` tokens that vLLM sees as prompt
(``engine.vllm.engine``): they come off ``max_tokens`` and ``min_tokens``, and they count for
``repetition_penalty`` (prompt or output alike) but not for ``frequency_penalty`` or
``presence_penalty``, which vLLM counts over its own output only (Interlock's engine counts
them as output: a penalized migrated request may continue differently on vLLM). A migrated
request asks for no ``prompt_logprobs``: its first leg sent them.
"""

from __future__ import annotations

import json
from typing import Any

from interlock.errors import InvalidRequest
from interlock.protocol import SamplingParams, StructuredOutput


def sampling_kwargs(s: SamplingParams, *, done: int = 0, prefill_only: bool = False) -> dict[str, Any]:
    """Keyword arguments of vLLM's ``SamplingParams`` for ``s`` (``structured_outputs`` as the
    keyword arguments of its ``StructuredOutputsParams``, or None); ``done``: tokens already
    generated (a migration), ``prefill_only``: a prefill leg handing off after one token."""
    return {
        "max_tokens": 1 if prefill_only else s.max_tokens - done,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k if s.top_k > 0 else -1,
        "min_p": s.min_p,
        "seed": s.seed,
        "stop_token_ids": list(s.stop_token_ids),
        "ignore_eos": s.ignore_eos,
        "min_tokens": max(0, s.min_tokens - done),
        "logprobs": s.logprobs,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
        "repetition_penalty": s.repetition_penalty,
        "logit_bias": dict(s.logit_bias) if s.logit_bias else None,
        "structured_outputs": structured_kwargs(s.structured) if s.structured is not None else None,
        "prompt_logprobs": s.prompt_logprobs if not done else None,
    }


def structured_kwargs(structured: StructuredOutput) -> dict[str, Any]:
    """Keyword arguments of vLLM's ``StructuredOutputsParams`` (exactly one constraint)."""
    kind, spec = structured.kind, structured.spec
    if kind == "json_schema":
        return {"json": spec}
    if kind == "json_object":
        return {"json_object": True}
    if kind == "regex":
        return {"regex": spec}
    if kind == "grammar":
        return {"grammar": spec}
    if kind == "choice":
        try:
            choices = json.loads(spec)
        except ValueError:
            choices = None
        if not isinstance(choices, list) or not choices or not all(isinstance(c, str) for c in choices):
            raise InvalidRequest("choice needs a JSON list of strings", param="response_format")
        return {"choice": choices}
    raise InvalidRequest(f"response_format type {kind!r} is not supported", param="response_format")
