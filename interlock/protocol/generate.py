"""Generate request and streamed outputs between frontend/router and workers (wire types).

Token counters (used with these exact names everywhere):
  num_prompt_tokens  tokens in the prompt
  num_cached_tokens  prompt tokens served from the prefix cache (or from a remote prefill)
  token_ids          in a GenerateOutput: the *new* tokens of this chunk only

Priority (the one definition; vLLM's convention): an integer, default 0, and a *lower* value is
*more important*. Clients set it with ``priority`` in the request body (vLLM's extension) or the
``x-priority`` header (the body wins). The router's admission queue dispatches lower values
first, then first come first served; an engine's waiting queue orders by priority, then arrival;
when an engine must preempt a running request it takes the least important (largest value), then
the newest; and with ``preempt_enabled`` a waiting request may preempt a running one only when it
is strictly more important.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeAlias

import msgspec

from interlock.protocol import packed_ids
from interlock.protocol.sampling import SamplingParams
from interlock.protocol.transfer import TransferDescriptor

if TYPE_CHECKING:
    PromptIds: TypeAlias = Sequence[int]
else:
    PromptIds = array
    """msgspec reads the field as ``array`` through ``packed_ids.dec_hook``."""


class KVTransferParams(msgspec.Struct, frozen=True, kw_only=True):
    """Disaggregation hand-off. ``do_remote_decode``: this worker prefills only and keeps the
    blocks for a remote puller; ``do_remote_prefill``: this worker receives the prompt's KV from
    ``source`` instead of computing it."""

    do_remote_decode: bool = False
    do_remote_prefill: bool = False
    transfer_id: str = ""
    source_block_ids: tuple[int, ...] = ()
    num_computed_tokens: int = 0
    first_token_id: int | None = None
    descriptor: TransferDescriptor | None = None
    """Where the staged KV payload can be pulled from (set by the prefill worker)."""
    engine_params: bytes = b""
    """A guest engine's own hand-off, opaque above the worker (vLLM's ``kv_transfer_params``,
    msgpack): set by the prefill worker, passed unchanged to the decode worker, which must
    announce the same ``kv_connector`` (``InstanceInfo.metadata``)."""


class GenerateRequest(msgspec.Struct, frozen=True, kw_only=True):
    request_id: str
    token_ids: PromptIds
    """The prompt's ids: any sequence of ints built in Python; on the wire packed, 4 bytes an id
    (``packed_ids``: the router sends ``packed_ids.pack(ids)``, encoded with its ``enc_hook``); as
    a worker decodes it (with ``packed_ids.dec_hook``), an ``array('I')``. Read, never changed."""
    sampling: SamplingParams = SamplingParams()
    model: str = ""
    priority: int = 0
    """Lower is more important (see the module docstring)."""
    kv_transfer: KVTransferParams | None = None
    resume_token_ids: tuple[int, ...] = ()
    """Migration: output tokens an earlier worker already generated (and the client already has).
    This worker continues after them as if it had generated them itself: they count against
    ``max_tokens`` and ``min_tokens``, a seeded draw for output token i still uses (seed, i),
    and only the tokens after them are streamed back. ``num_prompt_tokens`` stays the prompt's.
    A resumed request's prompt logprobs went out with the first leg: it does not compute them."""
    traceparent: str | None = None
    """W3C trace context of the span this request is served under (``metrics.tracing``), set
    by a router with tracing on; None: not traced (and what an older peer sends)."""

    @property
    def needs_local_prefill(self) -> bool:
        """Its prompt must be computed by the worker that serves it: prompt logprobs come from
        the logits of every prompt position, which neither a prefix hit nor a KV hand-off has."""
        return self.sampling.prompt_logprobs is not None and not self.resume_token_ids


class TokenLogprobs(msgspec.Struct, frozen=True, array_like=True):
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()
    """(token_id, logprob) of the top-N alternatives, best first."""


class ErrorInfo(msgspec.Struct, frozen=True, kw_only=True):
    code: str
    """The ``interlock.errors`` class's ``code``, so the receiver rebuilds the same error
    (``errors.rebuild``)."""
    message: str
    status: int = 500
    param: str | None = None
    """The request field the error is about (OpenAI's ``error.param``), when there is one."""


class GenerateOutput(msgspec.Struct, frozen=True, kw_only=True):
    request_id: str
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[TokenLogprobs, ...] | None = None
    finish_reason: str | None = None
    """None while running; then "stop" (EOS/stop token), "length", "abort" or "error"."""
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    error: ErrorInfo | None = None
    kv_transfer: KVTransferParams | None = None
    prompt_logprobs: tuple[TokenLogprobs, ...] | None = None
    """Only in the request's first chunk (the one with its first sampled token), when its
    sampling asks for them: one entry per prompt token from the second on (``num_prompt_tokens
    - 1``), ``token_id`` that prompt token, ``logprob`` its logprob given the tokens before it,
    ``top`` the ``prompt_logprobs`` best (token_id, logprob) at that position, best first."""

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


encode_request = msgspec.msgpack.Encoder(enc_hook=packed_ids.enc_hook).encode
"""A ``GenerateRequest`` as the request plane carries it (an ids array as packed bytes)."""
decode_request = msgspec.msgpack.Decoder(GenerateRequest, dec_hook=packed_ids.dec_hook).decode
"""What a worker reads: ``token_ids`` an ``array('I')`` (``packed_ids.dec_hook``)."""
