"""Token-budget scheduler (vLLM v1 style): one rule instead of prefill and decode phases.

Each step has a budget of ``max_num_batched_tokens``. Every request owes
``num_tokens - num_computed_tokens`` tokens of compute; the scheduler pays running requests
first (in admission order), then admits waiting ones while budget, sequence slots and blocks
last. A prompt larger than the remaining budget is cut into chunks (chunked prefill); a prefix
hit simply starts a request with ``num_computed_tokens > 0``; a decode is a debt of one token;
KV that arrives from another worker sets ``num_computed_tokens`` without any compute.

The waiting queue is ordered by priority, then arrival (the meaning of ``priority`` is defined
once, in ``interlock.protocol.generate``: lower values are served first). When a running request
needs a block and the pool is empty, the least important (largest ``priority`` value, then
newest) running request not yet scheduled in this step is preempted by recompute: its blocks are
freed and it goes back to the waiting queue with ``num_computed_tokens = 0`` (its outputs are
kept, so it recomputes prompt + outputs and continues exactly where it was; being older than
the requests queued behind it, it keeps its place among those of its priority). With
``preempt_enabled``, a waiting request that cannot get blocks or a batch slot also preempts the
least important running request that is strictly less important than itself (giving back the
budget it had this step); without it nothing running is preempted for priority. Admission keeps
``watermark`` blocks free so that running requests are rarely preempted. A request parked in
``WAITING_FOR_REMOTE_KV`` holds blocks but no batch slot and no budget.

KV tiers below the pool (host memory, disk): when the head of the queue has no blocks yet and a
lower tier holds the blocks right after its device-pool hits, it gets blocks for hits and
loaded blocks together and parks in ``loading`` (status WAITING_FOR_REMOTE_KV, as for remote
KV: no slot, no budget). The owner starts the copy (``newly_loading``) and reports its end with
``load_finished``; the request then re-enters the queue with the loaded blocks computed. A
request that ends while its load runs keeps its blocks until the load ends (``orphans``):
the copy is still writing into them.

A request that wants prompt logprobs computes its whole prompt (``Request.needs_prompt_logits``):
no prefix hit and no lower-tier load at admission (its blocks are still cached for others), and
each chunk asks the runner for the logits of its prompt rows (``prompt_logprob_positions``),
recorded in ``update`` and sent with the first output.

``schedule()`` returns pure data; ``update()`` applies what the runner computed and sampled,
checks stop conditions and returns the outputs of this step.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass
from time import perf_counter

from interlock.engine.config import SchedulerConfig
from interlock.engine.kv_cache_manager import KVCacheManager, cdiv
from interlock.engine.request import FINISH_REASONS, Request, RequestStatus
from interlock.engine.runner import RunnerOutput, ScheduledRequest, SchedulerOutput
from interlock.engine.stats import EngineStats
from interlock.errors import InvalidRequest, PromptTooLong
from interlock.protocol import ErrorInfo, GenerateOutput, KVTransferParams

RS = RequestStatus


@dataclass(frozen=True, slots=True)
class LoadOrder:
    """Copy the KV of ``block_hashes`` from a lower tier into ``block_ids`` (same length)."""

    request_id: str
    block_ids: tuple[int, ...]
    block_hashes: tuple[int, ...]


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        kv: KVCacheManager,
        *,
        eos_token_ids: tuple[int, ...] = (),
    ) -> None:
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.max_num_seqs = config.max_num_seqs
        self.max_model_len = config.max_model_len
        self.chunked_prefill = config.enable_chunked_prefill
        self.preempt_enabled = config.preempt_enabled
        self.kv = kv
        self.block_size = kv.block_size
        self.eos_token_ids = frozenset(eos_token_ids)
        self.stats = EngineStats()
        """Preemptions and per-request times for the worker's metrics."""
        self.requests: dict[str, Request] = {}
        """Every live request: waiting, running or parked for remote KV."""
        self.waiting: deque[Request] = deque()
        """Ordered by ``_order`` (priority, then arrival)."""
        self.running: list[Request] = []
        self.remote_parked: dict[str, Request] = {}
        """WAITING_FOR_REMOTE_KV: blocks allocated, KV not yet imported."""
        self.newly_parked: list[str] = []
        """Parked since the owner last looked (it may hold KV data for them already)."""
        self.held: dict[str, Request] = {}
        """Finished prefill-only requests whose blocks wait for a remote decoder to pull them."""
        self.loading: dict[str, Request] = {}
        """Parked while a lower KV tier copies blocks into them (WAITING_FOR_REMOTE_KV)."""
        self.newly_loading: list[LoadOrder] = []
        """Loads to start (the owner drains this after ``schedule``)."""
        self.orphans: set[str] = set()
        """Requests that ended during their load: blocks freed at ``load_finished``."""
        self._loads_in_flight: set[str] = set()
        self.num_waiting_tokens = 0
        """Sum of ``num_tokens - num_computed_tokens`` over the waiting queue."""
        self._finished_ids: list[str] = []
        self._pending: list[GenerateOutput] = []
        self._reclaims_left = 0

    # ---- admission and removal ----
    def add_request(self, req: Request) -> None:
        """Queue a request; PromptTooLong if it could never run (costs nothing then)."""
        rid = req.request_id
        if rid in self.requests or rid in self.held or rid in self._loads_in_flight:
            raise InvalidRequest(f"duplicate request id {req.request_id!r}", param="request_id")
        total = req.num_prompt_tokens + req.sampling.max_tokens
        if total > self.max_model_len:
            raise PromptTooLong(
                f"prompt ({req.num_prompt_tokens} tokens) plus max_tokens "
                f"({req.sampling.max_tokens}) exceeds the context length of {self.max_model_len}",
                param="max_tokens",
            )
        if cdiv(total, self.block_size) > self.kv.pool.num_blocks:
            raise PromptTooLong(
                f"prompt plus max_tokens needs {cdiv(total, self.block_size)} KV blocks, "
                f"the pool has {self.kv.pool.num_blocks}",
                param="max_tokens",
            )
        if req.output_token_ids:  # a remote prefill's first token may already end it
            status = self._stop_status(req, req.output_token_ids[-1])
            if status is not None:
                req.status = status
                self._pending.append(self._output(req))
                return
        self.requests[req.request_id] = req
        self._enqueue(req)

    def _enqueue(self, req: Request) -> None:
        waiting = self.waiting
        if not waiting or _order(waiting[-1]) <= _order(req):
            waiting.append(req)  # the usual case: a new arrival of the lowest priority so far
        else:
            waiting.insert(bisect.bisect_right(waiting, _order(req), key=_order), req)
        self.num_waiting_tokens += req.num_tokens - req.num_computed_tokens

    def _dequeue_head(self) -> Request:
        req = self.waiting.popleft()
        self.num_waiting_tokens -= req.num_tokens - req.num_computed_tokens
        return req

    def abort(self, request_id: str) -> bool:
        """End a request wherever it is; its final output (``abort``) comes with the next update."""
        held = self.held.pop(request_id, None)
        if held is not None:
            self.kv.free(request_id)
            return True
        req = self.requests.get(request_id)
        if req is None:
            return False
        self._remove(req)
        self._finish(req, RS.FINISHED_ABORTED)
        self._pending.append(self._output(req))
        return True

    def _remove(self, req: Request) -> None:
        """Take a live request out of whichever queue it is in."""
        if req.status == RS.RUNNING:
            self.running.remove(req)
        elif req.request_id in self.loading:
            del self.loading[req.request_id]
        elif req.status == RS.WAITING_FOR_REMOTE_KV:
            del self.remote_parked[req.request_id]
        else:
            self.waiting.remove(req)
            self.num_waiting_tokens -= req.num_tokens - req.num_computed_tokens

    def _finish(self, req: Request, status: RequestStatus, *, keep_blocks: bool = False) -> None:
        req.status = status
        del self.requests[req.request_id]
        if keep_blocks:
            self.held[req.request_id] = req
        elif req.request_id in self._loads_in_flight:
            self.orphans.add(req.request_id)  # the copy still writes into its blocks
        else:
            self.kv.free(req.request_id)
        self._finished_ids.append(req.request_id)

    def release_held(self, request_id: str) -> bool:
        """Free the blocks of a prefill-only request once its KV was pulled (or given up)."""
        if self.held.pop(request_id, None) is None:
            return False
        self.kv.free(request_id)
        return True

    # ---- remote prefill (KV arrives from another worker) ----
    def resume_remote(self, request_id: str, num_computed_tokens: int) -> Request:
        """KV for a parked request is in its blocks (or not: ``num_computed_tokens = 0``)."""
        req = self.remote_parked.pop(request_id)
        req.awaiting_kv = False
        req.num_computed_tokens = num_computed_tokens
        if not req.admitted:
            req.num_cached_tokens = min(num_computed_tokens, req.num_prompt_tokens)
        req.status = RS.WAITING
        self.kv.cache_full_blocks(req)
        self._enqueue(req)
        return req

    # ---- KV loaded from a lower tier ----
    def load_finished(self, request_id: str, num_loaded: int) -> None:
        """The load of a parked request ended with its first ``num_loaded`` blocks intact."""
        self._loads_in_flight.discard(request_id)
        if request_id in self.orphans:
            self.orphans.discard(request_id)
            self.kv.free(request_id)
            return
        req = self.loading.pop(request_id)
        req.num_computed_tokens += num_loaded * self.block_size
        req.status = RS.WAITING
        self.kv.cache_full_blocks(req)
        self._enqueue(req)

    def _park_for_load(self, req: Request) -> bool | None:
        """Blocks for the head's device hits plus what a lower tier holds after them, and park
        it while the copy runs. True: parked; False: nothing to load; None: no blocks now."""
        kv = self.kv
        if kv.tiers is None or req.awaiting_kv or req.needs_prompt_logits or kv.has_blocks(req.request_id):
            return False
        hits, computed = kv.get_computed_blocks(req)
        lower = kv.lower_tier_blocks(req, len(hits))
        if not lower:
            return False
        new = kv.allocate_slots(
            req,
            lower * self.block_size,
            hits,
            num_computed_tokens=computed,
            watermark=bool(self.running),
        )
        if new is None:
            return None
        self._dequeue_head()
        req.num_computed_tokens = computed
        req.status = RS.WAITING_FOR_REMOTE_KV
        rid = req.request_id
        self.loading[rid] = req
        self._loads_in_flight.add(rid)
        first = len(hits)
        self.newly_loading.append(
            LoadOrder(rid, tuple(new[:lower]), tuple(req.block_hashes[first : first + lower]))
        )
        return True

    # ---- the step ----
    def schedule(self) -> SchedulerOutput:
        budget = self.max_num_batched_tokens
        self._reclaims_left = len(self.requests)
        scheduled: list[ScheduledRequest] = []
        budget, preempted = self._schedule_running(scheduled, budget)
        if not preempted:
            self._schedule_waiting(scheduled, budget)
        finished: tuple[str, ...] = ()
        if scheduled and self._finished_ids:
            finished, self._finished_ids = tuple(self._finished_ids), []
        return SchedulerOutput(scheduled=scheduled, finished_request_ids=finished)

    def _schedule_running(self, scheduled: list[ScheduledRequest], budget: int) -> tuple[int, bool]:
        running = self.running
        preempted = False
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            while self.kv.allocate_slots(req, n) is None:
                victim = max(running[i:], key=_order)
                self._preempt(victim)
                preempted = True
                if victim is req:
                    break
            if req.status != RS.RUNNING:
                continue  # preempted itself; running[i] is now the next request
            scheduled.append(self._scheduled(req, n))
            budget -= n
            i += 1
        return budget, preempted

    def _preempt(self, req: Request) -> None:
        self.stats.preemptions += 1
        self.running.remove(req)
        self.kv.free(req.request_id)
        req.status = RS.PREEMPTED
        req.num_computed_tokens = 0
        self._finished_ids.append(req.request_id)
        self._enqueue(req)

    def _schedule_waiting(self, scheduled: list[ScheduledRequest], budget: int) -> None:
        waiting = self.waiting
        while waiting and budget > 0:
            req = waiting[0]
            if req.awaiting_kv and not self.kv.has_blocks(req.request_id):
                if not self._park_remote(req) and not self._reclaim(req):
                    return
                continue
            loading = self._park_for_load(req)
            if loading:
                continue
            if len(self.running) >= self.max_num_seqs:
                freed = self._preempt_for(req, scheduled)
                if freed is None:
                    return
                budget += freed
                continue
            n = self._admit(req, budget) if loading is False else None
            if n is None:
                if self._reclaim(req):
                    continue
                freed = self._preempt_for(req, scheduled)
                if freed is not None:
                    budget += freed
                    continue
            if not n:
                return
            scheduled.append(self._scheduled(req, n))
            budget -= n

    def _preempt_for(self, head: Request, scheduled: list[ScheduledRequest]) -> int | None:
        """``preempt_enabled``: preempt the least important running request if ``head`` is more
        important; returns the budget it had in this step (0 if none), None when nothing is."""
        if not self.preempt_enabled or not self.running:
            return None
        victim = max(self.running, key=_order)
        if victim.priority <= head.priority:
            return None
        freed = 0
        for k, s in enumerate(scheduled):
            if s.request_id == victim.request_id:
                freed = len(s.token_ids)
                del scheduled[k]
                break
        self._preempt(victim)
        return freed

    def _reclaim(self, head: Request) -> bool:
        """Nothing runs, yet the head cannot get blocks: they are all held by queued requests
        (parked for remote KV, or KV imported but not yet admitted). Take them from the newest
        such request so the queue moves; it re-parks (or recomputes) later. False: none."""
        if self.running or self._reclaims_left <= 0:
            return False
        # Only newer requests give way to older ones, so reclaiming cannot cycle.
        holders = [r for r in self.remote_parked.values() if r.arrival > head.arrival]
        holders += [r for r in self.waiting if r.arrival > head.arrival and self.kv.has_blocks(r.request_id)]
        if not holders:
            return False
        self._reclaims_left -= 1
        victim = max(holders, key=lambda r: r.arrival)
        self.kv.free(victim.request_id)
        victim.remote_kv_imported = 0  # whatever was imported went with the blocks
        victim.remote_kv_copied = (0, 1)
        if victim.status == RS.WAITING_FOR_REMOTE_KV:
            del self.remote_parked[victim.request_id]
            victim.status = RS.WAITING
            self._enqueue(victim)
        else:
            self.num_waiting_tokens += victim.num_computed_tokens
            victim.num_computed_tokens = 0
        return True

    def _admit(self, req: Request, budget: int) -> int | None:
        """Give the head of the queue blocks and a slot; returns tokens scheduled (0: not
        within the budget, None: no blocks)."""
        kv = self.kv
        if kv.has_blocks(req.request_id) or req.needs_prompt_logits:  # no logits in a hit
            hits: list[int] = []
            computed = req.num_computed_tokens
        else:
            hits, computed = kv.get_computed_blocks(req)
        n = req.num_tokens - computed
        if n > budget:
            if not self.chunked_prefill:
                return 0
            n = budget
        # With nothing running there is nobody to protect: skip the watermark (no starvation).
        new = kv.allocate_slots(req, n, hits, num_computed_tokens=computed, watermark=bool(self.running))
        if new is None:
            return None
        self._dequeue_head()
        req.num_computed_tokens = computed
        if not req.admitted:
            req.admitted = True
            req.num_cached_tokens = computed
            req.scheduled_at = now = perf_counter()
            self.stats.queue_time.observe(now - req.queued_at)
        req.status = RS.RUNNING
        self.running.append(req)
        return n

    def _park_remote(self, req: Request) -> bool:
        """Allocate blocks for the prompt whose KV another worker computes; no slot, no budget."""
        if self.kv.allocate_for_remote(req, watermark=bool(self.running)) is None:
            return False
        self._dequeue_head()
        req.status = RS.WAITING_FOR_REMOTE_KV
        self.remote_parked[req.request_id] = req
        self.newly_parked.append(req.request_id)
        return True

    def _scheduled(self, req: Request, n: int) -> ScheduledRequest:
        start = req.num_computed_tokens
        return ScheduledRequest(
            request_id=req.request_id,
            token_ids=req.all_token_ids[start : start + n],
            start_pos=start,
            block_table=self.kv.block_table(req.request_id),
            sampling=req.sampling,
            do_sample=start + n == req.num_tokens,
            num_output_tokens=len(req.output_token_ids),
            prompt_token_ids=req.prompt_token_ids,
            output_token_ids=req.output_token_ids,
            prompt_logprob_positions=req.prompt_logprob_positions(start, n),
        )

    # ---- after the runner ----
    def update(self, batch: SchedulerOutput, result: RunnerOutput) -> list[GenerateOutput]:
        outputs, self._pending = self._pending, []
        any_finished = False
        requests, sampled, logprobs = self.requests, result.sampled, result.logprobs
        cache_full_blocks = self.kv.cache_full_blocks
        for s in batch.scheduled:
            req = requests.get(s.request_id)
            if req is None or req.status != RS.RUNNING:
                continue
            if s.prompt_logprob_positions:
                _record_prompt_logprobs(req, s, result)
            req.num_computed_tokens += len(s.token_ids)
            cache_full_blocks(req)
            if not s.do_sample:
                continue
            token = sampled[s.request_id]
            req.append_output(token)
            if req.scheduled_at > 0.0:  # its first token: the prefill's time
                self.stats.prefill_time.observe(perf_counter() - req.scheduled_at)
                req.scheduled_at = -1.0
            if logprobs and s.request_id in logprobs:
                req.pending_logprobs.append(logprobs[s.request_id])
            status = self._stop_status(req, token)
            if status is not None:
                any_finished = True
                self._finish(req, status, keep_blocks=self._keeps_kv(req, status))
            outputs.append(self._output(req))
        if any_finished:
            self.running = [r for r in self.running if r.status == RS.RUNNING]
        return outputs

    def fail(self, batch: SchedulerOutput, error: ErrorInfo) -> list[GenerateOutput]:
        """The runner failed on this batch: end its requests with ``error``, keep the rest."""
        outputs, self._pending = self._pending, []
        for s in batch.scheduled:
            req = self.requests.get(s.request_id)
            if req is None:
                continue
            self._remove(req)
            self._finish(req, RS.FINISHED_ERROR)
            outputs.append(self._output(req, error=error))
        return outputs

    def _stop_status(self, req: Request, token: int) -> RequestStatus | None:
        sp = req.sampling
        n_out = len(req.output_token_ids)
        if n_out >= sp.min_tokens and (
            (token in self.eos_token_ids and not sp.ignore_eos) or token in sp.stop_token_ids
        ):
            return RS.FINISHED_STOPPED
        if n_out >= sp.max_tokens or req.num_tokens >= self.max_model_len:
            return RS.FINISHED_LENGTH
        if req.remote_decode:
            return RS.FINISHED_LENGTH  # prefill-only: the remote decoder continues
        return None

    def _keeps_kv(self, req: Request, status: RequestStatus) -> bool:
        """A prefill-only request keeps its blocks if a remote decoder still has work to do."""
        return (
            req.remote_decode
            and status == RS.FINISHED_LENGTH
            and len(req.output_token_ids) < req.sampling.max_tokens
        )

    def _output(self, req: Request, *, error: ErrorInfo | None = None) -> GenerateOutput:
        logprobs = None
        if req.pending_logprobs:
            logprobs, req.pending_logprobs = tuple(req.pending_logprobs), []
        return GenerateOutput(
            request_id=req.request_id,
            token_ids=req.take_new_tokens(),
            logprobs=logprobs,
            finish_reason=FINISH_REASONS.get(req.status),
            num_prompt_tokens=req.num_prompt_tokens,
            num_cached_tokens=req.num_cached_tokens,
            error=error,
            kv_transfer=self._transfer_params(req) if req.request_id in self.held else None,
            prompt_logprobs=req.take_prompt_logprobs(),
        )

    def _transfer_params(self, req: Request) -> KVTransferParams:
        kt = req.kv_transfer
        n_blocks = cdiv(req.num_prompt_tokens, self.block_size)
        return KVTransferParams(
            do_remote_prefill=True,
            transfer_id=(kt.transfer_id if kt is not None and kt.transfer_id else req.request_id),
            source_block_ids=tuple(self.kv.block_table(req.request_id)[:n_blocks]),
            num_computed_tokens=req.num_prompt_tokens,
            first_token_id=req.output_token_ids[0],
        )

    # ---- figures ----
    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting) + len(self.remote_parked) + len(self.loading)

    def queued_prefill_tokens(self) -> int:
        """Prompt tokens admitted or waiting that are not yet computed."""
        total = self.num_waiting_tokens
        for r in self.running:
            left = r.num_prompt_tokens - r.num_computed_tokens
            if left > 0:
                total += left
        return total

    def has_pending(self) -> bool:
        return bool(self._pending)

    def has_unfinished(self) -> bool:
        return bool(self.requests) or bool(self._pending)


def _record_prompt_logprobs(req: Request, s: ScheduledRequest, result: RunnerOutput) -> None:
    """Append the chunk's prompt logprobs (positions the runner was asked for, in order)."""
    entries = result.prompt_logprobs.get(s.request_id, ())
    assert req.prompt_logprobs is not None and len(entries) == len(s.prompt_logprob_positions)
    assert s.prompt_logprob_positions.start == len(req.prompt_logprobs), "prompt logprobs out of order"
    req.prompt_logprobs.extend(entries)


def _order(req: Request) -> tuple[int, int]:
    """Service order: priority (lower first), then arrival (older first)."""
    return (req.priority, req.arrival)
