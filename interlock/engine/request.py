"""The engine's mutable view of one request, built from a wire ``GenerateRequest`` at the edge.

Token counters (these exact names, everywhere in the engine):

  prompt_token_ids     the prompt, as received (never changed); num_prompt_tokens its length
  output_token_ids     tokens generated so far (list, grows by one per sampled step)
  all_token_ids        prompt + output: the sequence whose KV the engine computes
  num_tokens           len(all_token_ids)
  num_computed_tokens  leading tokens of all_token_ids whose KV is in the request's blocks; the
                       scheduler hands out ``num_tokens - num_computed_tokens`` tokens of budget
                       until they catch up (prefill, chunked prefill, decode are all this one rule)
  num_cached_tokens    prompt tokens served from the prefix cache (or a remote prefill) at the
                       first admission; reported in outputs, never changed by preemption
  num_emitted_tokens   output tokens already sent in a GenerateOutput
  block_hashes         kvhash chain over the full blocks of all_token_ids, extended as tokens
                       arrive (never recomputed from scratch)

Prompt logprobs (``SamplingParams.prompt_logprobs``): the row of prompt position p predicts
prompt token p + 1, so positions 0 .. num_prompt_tokens - 2 each give one entry, recorded in
``prompt_logprobs`` in position order as chunks compute them. The first output takes the list
(it becomes None then); until then the request must compute every prompt position itself
(``needs_prompt_logits``): no prefix hit, no KV loaded from a lower tier or another worker.
"""

from __future__ import annotations

import enum
from array import array
from collections.abc import Sequence
from time import perf_counter

from interlock import kvchain, kvhash
from interlock.protocol import GenerateRequest, KVTransferParams, SamplingParams, TokenLogprobs


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    WAITING_FOR_REMOTE_KV = 2
    PREEMPTED = 3
    FINISHED_STOPPED = 4
    FINISHED_LENGTH = 5
    FINISHED_ABORTED = 6
    FINISHED_ERROR = 7

    @property
    def finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED


FINISH_REASONS: dict[RequestStatus, str] = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
}


class Request:
    __slots__ = (
        "request_id",
        "prompt_token_ids",
        "num_prompt_tokens",
        "output_token_ids",
        "all_token_ids",
        "sampling",
        "priority",
        "arrival",
        "kv_transfer",
        "block_size",
        "block_hashes",
        "num_computed_tokens",
        "num_cached_tokens",
        "num_emitted_tokens",
        "status",
        "admitted",
        "awaiting_kv",
        "pending_logprobs",
        "prompt_logprobs",
        "remote_kv_data",
        "remote_kv_imported",
        "remote_kv_copied",
        "queued_at",
        "scheduled_at",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: SamplingParams,
        *,
        block_size: int,
        priority: int = 0,
        arrival: int = 0,
        kv_transfer: KVTransferParams | None = None,
        prompt_logprobs: bool = False,
        packed: bytes | None = None,
    ) -> None:
        """``prompt_logprobs``: record them (``sampling.prompt_logprobs`` of a request whose
        first output is still to come); ``packed``: the prompt's ids as little-endian uint32,
        where the caller has them already (``kvhash.u32_bytes``)."""
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.num_prompt_tokens = len(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.all_token_ids: array[int] = array("I", prompt_token_ids)
        """Packed (4 bytes a token): a copy of a packed prompt costs µs, a list of ints ~15 ns a token."""
        self.sampling = sampling
        self.priority = priority
        self.arrival = arrival
        """Admission order (a counter); ties in priority go to the older request."""
        self.kv_transfer = kv_transfer
        self.block_size = block_size
        self.block_hashes: list[int] = kvchain.hash_blocks(prompt_token_ids, block_size, packed=packed)
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0
        self.num_emitted_tokens = 0
        self.status = RequestStatus.WAITING
        self.admitted = False
        """True once it first ran (num_cached_tokens is fixed then)."""
        self.awaiting_kv = kv_transfer is not None and kv_transfer.do_remote_prefill
        """Its prompt KV is still to come from another worker (cleared once imported or given up)."""
        self.pending_logprobs: list[TokenLogprobs] = []
        self.prompt_logprobs: list[TokenLogprobs] | None = [] if prompt_logprobs else None
        """Entries of prompt positions 0 .. len - 1 so far; None: not wanted, or already sent."""
        self.remote_kv_data: bytes | memoryview | None = None
        """KV handed over for a remote prefill before blocks were allocated for it."""
        self.remote_kv_imported = 0
        """Blocks of a streamed remote KV already imported into this request's blocks (back to
        0 whenever the blocks are taken away)."""
        self.remote_kv_copied = (0, 1)
        """The one copy in steps: (parts copied, parts) of its remote KV, each part a slice of
        every block (``EngineCore.copy_remote_blocks``; back to (0, 1) whenever the blocks are
        taken away)."""
        self.queued_at = perf_counter()
        """When it reached the engine (for its queue time)."""
        self.scheduled_at = 0.0
        """When it first ran (0: not yet; -1: its first token is counted already)."""

    @classmethod
    def from_generate(
        cls, req: GenerateRequest, *, block_size: int, arrival: int, packed: bytes | None = None
    ) -> Request:
        return cls(
            req.request_id,
            req.token_ids,  # as decoded (an array('I') off the wire: no copy), never changed
            req.sampling,
            block_size=block_size,
            priority=req.priority,
            arrival=arrival,
            kv_transfer=req.kv_transfer,
            prompt_logprobs=req.needs_local_prefill,
            packed=packed,
        )

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def remote_decode(self) -> bool:
        """This worker prefills only and keeps the KV for a remote decoder."""
        return self.kv_transfer is not None and self.kv_transfer.do_remote_decode

    @property
    def needs_prompt_logits(self) -> bool:
        """Prompt logprobs are still to be computed or sent: every prompt position is computed
        here (a prefix hit or imported KV has no logits)."""
        return self.prompt_logprobs is not None

    def prompt_logprob_positions(self, start: int, num_tokens: int) -> range:
        """Positions of a chunk (``num_tokens`` from ``start``) whose rows give prompt logprobs
        not yet recorded: never the last prompt position (its row samples the first output
        token), never one recorded before a preemption."""
        if self.prompt_logprobs is None:
            return range(0)
        last = self.num_prompt_tokens - 1
        return range(max(start, len(self.prompt_logprobs)), min(start + num_tokens, last))

    def take_prompt_logprobs(self) -> tuple[TokenLogprobs, ...] | None:
        """All prompt logprobs, once, with the first output token; None before and after."""
        if self.prompt_logprobs is None or not self.output_token_ids:
            return None
        entries, self.prompt_logprobs = tuple(self.prompt_logprobs), None
        assert len(entries) == self.num_prompt_tokens - 1, "prompt logprobs of a partly computed prompt"
        return entries

    def append_output(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        toks = self.all_token_ids
        toks.append(token_id)
        bs = self.block_size
        if len(toks) % bs == 0:
            parent = self.block_hashes[-1] if self.block_hashes else kvhash.ROOT_PARENT
            self.block_hashes.append(kvhash.hash_block(parent, toks[-bs:]))

    def take_new_tokens(self) -> tuple[int, ...]:
        """Output tokens not yet emitted; marks them emitted."""
        new = tuple(self.output_token_ids[self.num_emitted_tokens :])
        self.num_emitted_tokens = len(self.output_token_ids)
        return new

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, {self.status.name}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, out={len(self.output_token_ids)})"
        )
