"""The seam between the scheduler (policy, pure Python) and a model runner (compute).

The scheduler decides; the runner computes. Per step the core calls
``runner.execute(SchedulerOutput) -> RunnerOutput``. The runner never decides policy and the
scheduler never imports torch.

Positions: a ``ScheduledRequest`` feeds ``token_ids`` at positions
``start_pos .. start_pos + len(token_ids) - 1``. Its KV goes into the slots of
``block_table`` (slot of position p: ``block_table[p // block_size]``, offset ``p % block_size``).
KV of positions ``< start_pos`` is already in those blocks (prefix hit, earlier chunk, or
transferred from another worker).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from interlock.protocol import SamplingParams, TokenLogprobs
from interlock.protocol.transfer import SharedCacheRegion

if TYPE_CHECKING:
    from interlock.engine.shared_cache import SharedCacheView


@dataclass(frozen=True, slots=True)
class ScheduledRequest:
    request_id: str
    token_ids: Sequence[int]
    """Tokens to compute this step."""
    start_pos: int
    """num_computed_tokens before this step."""
    block_table: Sequence[int]
    """All blocks of the request, in order; covers at least start_pos + len(token_ids)."""
    sampling: SamplingParams
    do_sample: bool
    """True when this chunk ends at the last known token: sample the next one."""
    num_output_tokens: int = 0
    """Output tokens generated so far (for per-request seeded generators)."""
    prompt_token_ids: Sequence[int] = ()
    output_token_ids: Sequence[int] = ()
    """The request's prompt and output so far (migrated ``resume_token_ids`` included), for
    sampling penalties. References to the request's own sequences, never copies: valid during
    this step's ``execute`` only (the output grows after it), and read only by rows whose
    sampling sets a penalty, so a long prompt costs a step nothing otherwise."""
    prompt_logprob_positions: range = range(0)
    """Positions of this chunk whose rows give prompt logprobs (``sampling.prompt_logprobs``):
    the row of position p gives the logprob of prompt token p + 1 (``prompt_token_ids``) and
    the top alternatives. Empty for most requests; never the last prompt position (its row
    samples)."""


@dataclass(frozen=True, slots=True)
class SchedulerOutput:
    scheduled: Sequence[ScheduledRequest]
    finished_request_ids: Sequence[str] = ()
    """Requests that ended (finished, aborted, preempted) since the last step: drop their state."""

    @property
    def num_batched_tokens(self) -> int:
        return sum(len(r.token_ids) for r in self.scheduled)


@dataclass(slots=True)
class RunnerOutput:
    sampled: dict[str, int] = field(default_factory=dict)
    """request_id -> next token, for every scheduled request with do_sample."""
    logprobs: dict[str, TokenLogprobs] = field(default_factory=dict)
    """Only for requests whose sampling asks for logprobs."""
    prompt_logprobs: dict[str, list[TokenLogprobs]] = field(default_factory=dict)
    """request_id -> one entry per position of its ``prompt_logprob_positions``, in order
    (only requests with such positions in this step)."""


class ModelRunner(Protocol):
    block_size: int
    num_blocks: int
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    kv_block_nbytes: int
    """Bytes of one block's KV across all layers (K and V), as exported."""

    def execute(self, batch: SchedulerOutput) -> RunnerOutput: ...

    def close(self) -> None:
        """Release what the runner started (a group's rank processes); idempotent."""
        ...

    def offload(self) -> bool:
        """Drop the weights while idle; the next ``execute`` loads them again. False: not done
        (already out, or this runner keeps them)."""
        ...

    @property
    def weights_load_s(self) -> float:
        """Seconds the next step would wait for offloaded weights (0 while they are in)."""
        ...

    last_reload_s: float
    """Seconds the last load of offloaded weights took (0: none yet)."""

    def load_weights(self) -> float:
        """Bring offloaded weights back now (a prefetch); seconds it took, 0 if they were in."""
        ...

    def export_blocks(self, block_ids: Sequence[int], out: memoryview) -> None:
        """Copy the KV of ``block_ids`` into ``out`` (len(block_ids) * kv_block_nbytes bytes)."""
        ...

    def import_blocks(self, block_ids: Sequence[int], data: memoryview) -> None:
        """Copy exported KV ``data`` into ``block_ids`` of this runner's cache."""
        ...

    def import_each(self, block_ids: Sequence[int], blocks: Sequence[memoryview]) -> None:
        """``import_blocks`` of blocks that lie apart: ``blocks[k]`` (one exported block) into
        ``block_ids[k]`` (host-tier slots onboarded in one call)."""
        ...

    def shared_region(self) -> SharedCacheRegion | None:
        """Where a peer of this host finds this runner's KV cache (None: not shared)."""
        ...

    def region_mismatch(self, region: SharedCacheRegion) -> str:
        """Why blocks of a peer's shared cache cannot be copied into this one ("": they can)."""
        ...

    def kv_layout(self) -> tuple[int, int, str]:
        """``(piece, pieces, dtype)`` of an exported block (``SharedCacheRegion.layout``): what
        a peer's blocks must share to be imported here."""
        ...

    def copy_from_shared(
        self,
        view: SharedCacheView,
        src_ids: Sequence[int],
        block_ids: Sequence[int],
        part: tuple[int, int] = (0, 1),
    ) -> None:
        """Block ``src_ids[k]`` of a peer's mapped cache into our ``block_ids[k]`` (one copy);
        ``part`` = (k, parts): only part k of ``parts`` of every block (parts 0..parts-1 copy
        the blocks whole: the one copy in steps). IndexError names an id out of range, ValueError
        a part that does not exist (nothing copied then)."""
        ...
