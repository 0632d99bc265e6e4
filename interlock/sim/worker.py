"""A fast simulated engine worker for trace replay: the engine's scheduler and block accounting
(``engine/scheduler.py``, ``sim/pool.py``) with the mock step-time model, advanced by events.

Why not the real ``EngineCore`` with the mock runner: it is exact but steps one token of every
running request per Python call and hashes real tokens; replaying an hour of a trace must take
seconds. So this keeps the engine's rules and counters and drops the tokens:

* a step's budget of ``max_num_batched_tokens`` pays running requests first, in admission
  order (a decode owes one token, a prompt the rest of it, cut into chunks), then admits
  waiting ones (priority, then arrival; lower priority value first) while budget, sequence
  slots and blocks last; the head of the queue that cannot get blocks stops admission;
* blocks are allocated as tokens need them, never for the output up front: admission takes the
  cached prefix (longest run of cached keys, at least one token left to compute) plus blocks
  for the first chunk, keeping ``watermark`` of the pool free while something runs; each later
  chunk or decode step extends the request's blocks; full blocks are cached as they are
  computed and published (``BlockStored``), evictions as ``BlockRemoved``;
* a running request that cannot get a block preempts, by recompute, the least important
  (largest priority value, then newest) running request not yet scheduled in the step, itself
  included: its blocks are freed and it waits again to recompute prompt and outputs; a step with
  a preemption admits nobody. With ``preempt_enabled`` a waiting request that cannot get blocks
  or a slot preempts a strictly less important running one;
* a step costs ``TimingModel.step_s(prefill tokens, decodes, kv usage)`` with the mock runner's
  counting (a scheduled chunk of one token of a request with outputs is a decode; usage is the
  scheduled requests' context over the pool's tokens).

Decode-only stretches are one *macro step* of ``k`` steps, up to the next finish or the step
whose block allocation would fail, timed in closed form (decode time is a quadratic in KV
usage, which grows linearly, up to 2.18x the pool's tokens where ``decode_ms`` meets its floor).
Nothing can be admitted during one (free blocks only shrink and slots only free at a finish), so it
is exact; an arrival cuts it at the step in progress. Only the steps someone sees end are events
(its last, one that evicts, one whose paced load report leaves at once, each while the driver
polls); the others are applied when the next event comes (``_next_event``, ``_advance``).

Counters (the engine's names): ``num_tokens`` = prompt + outputs; ``computed`` is
``num_computed_tokens``; ``hit_tokens`` is ``num_cached_tokens`` (first admission only).
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import msgspec
import numpy as np

from interlock.engine.pacing import LOAD_INTERVAL_S, ReportPacer
from interlock.engine.timing import TimingModel, decode_ms
from interlock.protocol.events import (
    AllBlocksCleared,
    BlockStored,
    KVEvent,
    KVEventBatch,
    LoadReport,
)
from interlock.sim import native
from interlock.sim.pool import SimPool
from interlock.sim.tiers import SimTiers
from interlock.sim.trace import SimRequest

MOCKER_MAX_NUM_SEQS = 256
"""The replay's workers model Dynamo's mocker (``MockEngineArgs``: 256 sequences, 8,192 batched
tokens, blocks of 64), whose replay this one is checked against (BENCHMARKS.md), not this
project's engine: deliberately not ``deploy.DEFAULT_MAX_NUM_SEQS`` (64)."""

_A, _B, _C = -25.74, 54.01, 5.74
"""decode_ms(u) = A u^2 + B u + C on [0, 1] (checked against ``timing.decode_ms`` at import)."""
assert abs(decode_ms(0.5) - (_A * 0.25 + _B * 0.5 + _C)) < 1e-9
_U_QUADRATIC = 2.18
"""Up to this KV usage decode_ms is the quadratic (it reaches its 1 ms floor at 2.1826)."""
assert decode_ms(_U_QUADRATIC) > 1.0 and _A * _U_QUADRATIC**2 + _B * _U_QUADRATIC + _C > 1.0
_EMA = 0.2
"""As the engine core's load figures (``engine/core.py``)."""
_ENDS_AHEAD = 16
"""A stretch's step ends computed a batch at a time (a pacing interval holds a few steps)."""


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(slots=True, eq=False)
class SimSeq:
    req: SimRequest
    arrival_s: float
    order: tuple[int, int] = (0, 0)
    """(priority, arrival number): the engine's service order."""
    computed: int = 0
    outputs: int = 0
    keyed: list[int] = field(default_factory=list)
    """Keys of the cached blocks this request references, in table order."""
    unkeyed: int = 0
    """Its other blocks (not yet full, or a duplicate of a block cached by another)."""
    offered: int = 0
    """Leading blocks already offered to the cache."""
    running: bool = False
    admitted: bool = False
    hit_tokens: int = 0
    first_token_s: float = -1.0
    finish_s: float = -1.0
    uid: int = 0

    @property
    def num_tokens(self) -> int:
        return self.req.prompt_tokens + self.outputs

    @property
    def num_blocks(self) -> int:
        return len(self.keyed) + self.unkeyed

    def key(self, i: int) -> int:
        """Key of block ``i``: the prompt's hash, or one unique to this request."""
        hashes = self.req.block_hashes
        return hashes[i] if i < len(hashes) else -((self.uid << 24) | i) - 1


@dataclass(frozen=True)
class WorkerShape:
    """What a simulated worker is, whichever backend runs it (``SimWorker``, or the exact
    ``engine_worker.EngineWorker``): its KV pool, its step budget, its step-time model."""

    num_blocks: int
    block_size: int = 64
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = MOCKER_MAX_NUM_SEQS
    timing: TimingModel = TimingModel()
    publish_events: bool = True
    """False: no KV events (the router predicts the caches)."""
    report_interval_s: float = LOAD_INTERVAL_S
    """Load reports at most this often, as a deployed worker sends them (``engine/pacing.py``:
    one made sooner leaves at the interval's end); 0: after every step."""


class WorkerSink:
    """What a worker tells the replay driver (override the ones you need)."""

    def first_token(self, worker: object, seq: SimSeq, t: float) -> None: ...
    def finished(self, worker: object, seq: SimSeq, t: float) -> None: ...
    def kv_events(self, batch: KVEventBatch) -> None: ...
    def load(self, report: LoadReport) -> None: ...
    def wake(self, worker: object, t: float, asked_at: float | None = None) -> None:
        """Call ``worker.send_held_load(t)`` at ``t`` (a paced load report is held); schedule
        what it returns as the worker's next step end. ``asked_at``: when the report it sends
        is made, where the call is asked for ahead of it (None: now)."""

    def polls_steps(self) -> bool:
        """True while every step end must be an event (the driver's router holds queued
        requests: it tries them whenever a step ends)."""
        return False

    def itl(self, step_s: float, tokens: int) -> None: ...
    def itl_many(self, step_s: list[float], tokens: int) -> None:
        """``itl`` for each of several steps of ``tokens`` decodes, in order."""
        for x in step_s:
            self.itl(x, tokens)


class PacedLoads:
    """A simulated worker's load reports through its ``ReportPacer``, on virtual time."""

    __slots__ = ("_pacer", "_sink", "_worker")

    def __init__(self, worker: object, sink: WorkerSink, interval_s: float) -> None:
        self._pacer: ReportPacer[LoadReport] = ReportPacer(interval_s)
        self._sink = sink
        self._worker = worker

    def offer(self, report: LoadReport, now: float) -> None:
        send, wake_at = self._pacer.offer(report, now)
        if send is not None:
            self._sink.load(send)
        if wake_at is not None:
            self._sink.wake(self._worker, wake_at)

    def due(self, now: float) -> None:
        due = self._pacer.due(now)
        if due is not None:
            report, held_s = due
            self._sink.load(msgspec.structs.replace(report, held_s=held_s))

    @property
    def pacer(self) -> ReportPacer[LoadReport]:
        return self._pacer

    def arm(self, held_at: float) -> None:
        """A report made at ``held_at`` will be held: ask for its timer now."""
        wake_at = self._pacer.arm()
        if wake_at is not None:
            self._sink.wake(self._worker, wake_at, held_at)


class KVBatches:
    """Numbers one worker's KV event batches: live ones 0, 1, ...; a snapshot carries the seq
    of the last batch it includes, so live ones go on from +1."""

    __slots__ = ("_instance_id", "_next")

    def __init__(self, instance_id: str) -> None:
        self._instance_id = instance_id
        self._next = 0

    def live(self, now: float, events: Iterable[KVEvent]) -> KVEventBatch:
        batch = KVEventBatch(
            instance_id=self._instance_id, seq=self._next, timestamp=now, events=tuple(events)
        )
        self._next += 1
        return batch

    def snapshot(self, now: float, events: Iterable[KVEvent]) -> KVEventBatch:
        return KVEventBatch(
            instance_id=self._instance_id,
            seq=self._next - 1,
            timestamp=now,
            events=tuple(events),
            snapshot=True,
        )


@dataclass(slots=True)
class _Step:
    start: float
    end: float
    """End of the step in progress (of a stretch: of its current step)."""
    sched: list[tuple[SimSeq, int]]
    prefill: int
    decodes: int
    k: int
    """Steps in this stretch (1: a plain step)."""
    ctx0: int
    """Summed context of the decodes in the first step."""
    done: int = 0
    """Steps of the stretch already ended."""
    alloc: list[int] = field(default_factory=list)
    """Blocks each step of the stretch allocates."""
    queued: int = 0
    """Queued prefill tokens during the stretch (nothing changes it)."""
    ends: list[float] = field(default_factory=list)
    """Ends of the stretch's steps so far computed (``SimWorker._end_of``)."""


class SimWorker:
    def __init__(
        self,
        instance_id: str,
        shape: WorkerShape,
        *,
        sink: WorkerSink | None = None,
        watermark: float = 0.01,
        preempt_enabled: bool = False,
        tiers: SimTiers | None = None,
    ) -> None:
        self.instance_id = instance_id
        self.num_blocks = num_blocks = shape.num_blocks
        self.block_size = block_size = shape.block_size
        self.max_tokens = shape.max_num_batched_tokens
        self.max_seqs = shape.max_num_seqs
        self.timing = shape.timing
        self.publish_events = shape.publish_events
        self.preempt_enabled = preempt_enabled
        self.sink = sink or WorkerSink()
        self.tiers = tiers
        """Host KV tier below the pool (possibly shared with the host's other workers)."""
        self.pool = SimPool(num_blocks, block_size, watermark=watermark, tiers=tiers)
        self._native = native.load()
        self._load_s = 0.0
        """Modelled seconds of host-tier loads admitted into the step being planned."""
        self._kv_tokens_total = num_blocks * block_size
        self.waiting: deque[SimSeq] = deque()
        self.inbox: list[SimSeq] = []
        """Arrived during the step in progress."""
        self.running: list[SimSeq] = []
        self.waiting_tokens = 0
        """Sum of ``num_tokens - computed`` over the waiting queue."""
        self.step: _Step | None = None
        self.version = 0
        """Bumped whenever the current step's end time changes (stale heap entries skipped)."""
        self._arrivals = 0
        self._batches = KVBatches(instance_id)
        self._loads = PacedLoads(self, self.sink, shape.report_interval_s)
        self._prefill_tps = 0.0
        self._decode_step_s = 0.0
        self.num_preemptions = 0

    # ---- requests ----
    def enqueue(self, req: SimRequest, now: float) -> SimSeq:
        if _cdiv(req.prompt_tokens + req.output_tokens, self.block_size) > self.num_blocks:
            raise ValueError(
                f"request {req.request_id}: prompt plus output needs more KV blocks "
                f"than a worker has ({self.num_blocks})"
            )
        self._arrivals += 1
        s = SimSeq(req, now, order=(req.priority, self._arrivals), uid=self._arrivals)
        if self.step is None:
            self._enqueue(s)
        else:  # the engine takes it in after this step (whose report does not show it yet)
            self.inbox.append(s)
        return s

    def _enqueue(self, s: SimSeq) -> None:
        w = self.waiting
        if not w or w[-1].order <= s.order:
            w.append(s)
        else:
            w.insert(bisect.bisect_right(w, s.order, key=_order), s)
        self.waiting_tokens += s.num_tokens - s.computed

    @property
    def num_inflight(self) -> int:
        return len(self.inbox) + len(self.waiting) + len(self.running)

    # ---- scheduling (engine/scheduler.py, step for step) ----
    def _schedule(self) -> tuple[list[tuple[SimSeq, int]], bool]:
        """One step's chunks; True if nothing was admitted or preempted (a decode stretch may
        follow)."""
        budget = self.max_tokens
        sched: list[tuple[SimSeq, int]] = []
        running = self.running
        preempted = False
        i = 0
        while i < len(running) and budget > 0:
            s = running[i]
            n = min(s.num_tokens - s.computed, budget)
            while not self._extend(s, n):
                victim = max(running[i:], key=_order)
                self._preempt(victim)
                preempted = True
                if victim is s:
                    break
            if not s.running:
                continue
            sched.append((s, n))
            budget -= n
            i += 1
        if preempted:
            return sched, False
        quiet = True
        waiting = self.waiting
        while waiting and budget > 0:
            head = waiting[0]
            got = self._admit(head, budget) if len(running) < self.max_seqs else None
            if got is None:  # no slot or no blocks: only a priority preemption helps
                freed = self._preempt_for(head, sched)
                if freed is None:
                    break
                budget += freed
            else:
                sched.append((head, got))
                budget -= got
            quiet = False
        return sched, quiet

    def _extend(self, s: SimSeq, n: int) -> bool:
        need = _cdiv(s.computed + n, self.block_size) - s.num_blocks
        if need <= 0:
            return True
        if need > self.pool.free:
            return False
        self.pool.allocate(need)
        s.unkeyed += need
        return True

    def _admit(self, s: SimSeq, budget: int) -> int | None:
        bs = self.block_size
        limit = (s.num_tokens - 1) // bs
        keys = [s.key(i) for i in range(limit)] if s.outputs else s.req.block_hashes[:limit]
        pool = self.pool
        hits = pool.prefix(keys)
        lower = self.tiers.lookup(keys[hits:]) if self.tiers is not None else 0
        computed = (hits + lower) * bs
        n = min(s.num_tokens - computed, budget)
        need = _cdiv(computed + n, bs) - hits
        wm = pool.watermark_blocks if self.running else 0
        if need > pool.free - pool.revived(keys[:hits]) - wm:
            return None
        if lower:  # loaded first: this admission's own evictions must not push them out
            assert self.tiers is not None
            self._load_s += self.tiers.load(keys[hits : hits + lower])
        pool.touch(keys[:hits])
        pool.allocate(need)
        s.keyed = list(keys[:hits])
        s.unkeyed = need
        for key in keys[hits : hits + lower]:  # loaded into fresh blocks: cached there again
            if pool.store(key):
                s.unkeyed -= 1
                s.keyed.append(key)
        s.offered = hits + lower
        self.waiting.popleft()
        self.waiting_tokens -= s.num_tokens - s.computed
        s.computed = computed
        if not s.admitted:
            s.admitted = True
            s.hit_tokens = computed
        s.running = True
        self.running.append(s)
        return n

    def _preempt(self, s: SimSeq) -> None:
        self.running.remove(s)
        self.pool.release(s.keyed, s.unkeyed)
        s.keyed, s.unkeyed, s.offered = [], 0, 0
        s.running = False
        s.computed = 0
        self.num_preemptions += 1
        self._enqueue(s)

    def _preempt_for(self, head: SimSeq, sched: list[tuple[SimSeq, int]]) -> int | None:
        if not self.preempt_enabled or not self.running:
            return None
        victim = max(self.running, key=_order)
        if victim.order[0] <= head.order[0]:
            return None
        freed = 0
        for j, (s, n) in enumerate(sched):
            if s is victim:
                freed = n
                del sched[j]
                break
        self._preempt(victim)
        return freed

    # ---- stepping ----
    def start_step(self, now: float) -> float | None:
        """Plan the next step at ``now``; returns its end time, or None when idle. Inside a
        decode stretch: the end of its next step anyone sees (``_next_event``)."""
        if self.step is not None:
            return self._next_event(self.step) if self.step.k > 1 else self.step.end
        for s in self.inbox:
            self._enqueue(s)
        self.inbox.clear()
        sched, quiet = self._schedule()
        if not sched and self.waiting:  # preempted all it ran: admit at once (an empty step)
            sched, quiet = self._schedule()
        if not sched:
            return None
        prefill = decodes = ctx = 0
        for s, n in sched:
            ctx += s.computed + n
            if n == 1 and s.outputs:
                decodes += 1
            else:
                prefill += n
        st = _Step(now, now, sched, prefill, decodes, 1, ctx)
        if quiet and not prefill and len(sched) == len(self.running):
            self._stretch(st)
        if st.k > 1:
            st.end = now + self._decode_span(ctx, decodes, 1)
            st.ends.append(st.end)
            st.queued = self._queued_prefill()
        else:
            st.end = now + self.timing.step_s(prefill, decodes, ctx / self._kv_tokens_total)
        st.end += self._load_s  # host-tier loads of this step's admissions (pessimistic: serial)
        self._load_s = 0.0
        self.step = st
        self.version += 1
        return self._next_event(st) if st.k > 1 else st.end

    def _next_event(self, st: _Step) -> float | None:
        """The end of the stretch's next step that anyone sees: its last step (finishes, stores),
        one whose blocks evict cached ones (KV events), one whose load report leaves at once, or
        any step while the driver polls (``WorkerSink.polls_steps``). None when the pacing
        timer comes first: ``send_held_load`` then says. The steps in between are applied when
        an event comes (``_advance``): nothing outside the worker could tell them apart from
        events of their own, and a long decode costs an event per report, not per token."""
        if self.sink.polls_steps():
            return st.end
        loads = self._loads
        pacer = loads.pacer
        timer = pacer.timer_at
        if self.pool.has_events():
            return st.end  # the blocks this step got when it was planned evicted some
        plain = self.pool.plain
        j, end = st.done, st.end
        while True:
            if j + 1 >= st.k:
                return end  # the last step
            a = st.alloc[j]
            if a > plain:
                return end  # evicts: its KV events go out when it ends
            plain -= a
            if timer is None:
                if end - pacer.last >= pacer.interval_s:
                    return end  # its report leaves at once
                loads.arm(end)  # its report will be held: the timer that sends it, now
                timer = pacer.timer_at
                assert timer is not None
            if end >= timer:
                return None  # the timer first (a tie: the step ends first, as events do)
            j += 1
            end = st.ends[j] if j < len(st.ends) else self._end_of(st, j)

    def _end_of(self, st: _Step, j: int) -> float:
        """When step ``j`` of the stretch ends (each computed once; ``_ENDS_AHEAD`` at a time in
        C where it can, the same doubles, ``sim.native``)."""
        ends = st.ends
        if len(ends) <= j and self._native is not None:
            k0, k1 = len(ends) + 1, min(st.k, max(j + 1, len(ends) + _ENDS_AHEAD)) + 1
            more = self._native.decode_ends(
                st.start, st.ctx0, st.decodes, k0, k1, self._kv_tokens_total, self.timing.speedup, _A, _B, _C
            )
            if more is not None:
                ends += more
        while len(ends) <= j:
            ends.append(st.start + self._decode_span(st.ctx0, st.decodes, len(ends) + 1))
        return ends[j]

    def _step_s(self, ctx: int) -> float:
        """``_decode_span(ctx, n, 1)``, the same double, for one step at summed context ``ctx``."""
        kt = self._kv_tokens_total
        ms = _A * float(ctx * ctx) / (kt * kt) + _B * float(ctx) / kt + _C
        return ms / self.timing.speedup / 1000.0

    def _advance(self, now: float) -> None:
        """Apply the stretch's inner steps that ended by ``now``, in order, as if each had been
        an event at its end (``_next_event``). All but the last of them are unseen (their blocks
        come from plain free ones, their reports would be held and replaced), so they are applied
        together: one allocation, their times and the EMA in one call (``_decode_steps``), and
        only the last one's report made."""
        st = self.step
        assert st is not None
        if st.end > now or st.done + 1 >= st.k:
            return
        ends, j0 = st.ends, st.done
        while ends[-1] <= now and len(ends) < st.k:
            self._end_of(st, len(ends))
        last = bisect.bisect_right(ends, now, j0, min(st.k - 1, len(ends)))  # j0 .. last-1 ended
        n = st.decodes
        steps, ema = self._decode_steps(st.ctx0 + j0 * n, n, last - j0, self._decode_step_s)
        alloc = st.alloc
        quiet = sum(alloc[j0 : last - 1])
        assert quiet <= self.pool.plain, "an unseen step would have evicted"
        if quiet:
            self.pool.allocate(quiet)
        if alloc[last - 1]:
            self.pool.allocate(alloc[last - 1])  # the last one may evict: its events go out now
        self.sink.itl_many(steps, n)
        self._decode_step_s = ema
        st.done = last
        st.end = self._end_of(st, last)
        self._publish(ends[last - 1], steps[-1], n, st.queued)

    def _decode_steps(self, ctx: int, n: int, count: int, ema: float) -> tuple[list[float], float]:
        """``count`` decode steps' times from summed context ``ctx`` (``_step_s``) and the EMA
        after them: in C where it can (``sim.native``), the same doubles."""
        if self._native is not None:
            got: tuple[list[float], float] = self._native.decode_steps(
                ctx, n, count, self._kv_tokens_total, self.timing.speedup, _A, _B, _C, ema, _EMA
            )
            return got
        steps = []
        for i in range(count):
            x = self._step_s(ctx + i * n)
            steps.append(x)
            ema = _ema(ema, x)
        return steps, ema

    def repoll(self, now: float) -> float | None:
        """The driver polls from ``now`` on (``WorkerSink.polls_steps``): the end of the step in
        progress, where a stretch's next event now is (None: no stretch)."""
        st = self.step
        if st is None or st.k == 1:
            return None
        self._advance(now)
        self.version += 1
        return st.end

    def _stretch(self, st: _Step) -> None:
        """Make ``st`` a decode stretch: steps up to the next finish, and no further than the
        last step whose blocks the pool can still give. Step j >= 1 needs a block for each
        request with (computed + j) % bs == 0; ``st.alloc[j]`` counts them."""
        k = min(s.req.output_tokens - s.outputs for s, _ in st.sched)
        if k <= 1:
            return
        bs = self.block_size
        first = np.fromiter(
            ((-s.computed - 1) % bs + 1 for s, _ in st.sched), dtype=np.int64, count=len(st.sched)
        )
        hist = np.bincount(first, minlength=bs + 1)
        alloc = hist[(np.arange(k) - 1) % bs + 1]
        alloc[0] = 0  # step 0's blocks were allocated when it was scheduled
        k = min(k, int(np.searchsorted(np.cumsum(alloc), self.pool.free, side="right")))
        # and no step past the context where ``decode_ms`` stops being the quadratic (its floor
        # of 1 ms): summed context counts a shared prefix once per request, so it can pass the
        # pool's tokens; those steps go one by one, through ``TimingModel.step_s``
        k = min(k, (int(_U_QUADRATIC * self._kv_tokens_total) - st.ctx0) // st.decodes + 1)
        if k > 1:
            st.k = k
            st.alloc = alloc[:k].tolist()

    def _decode_span(self, ctx0: int, n: int, k: int) -> float:
        """Seconds for ``k`` decode-only steps of ``n`` requests starting at summed context
        ``ctx0`` (each step adds ``n``)."""
        kt = self._kv_tokens_total
        s1 = k * ctx0 + n * k * (k - 1) / 2
        s2 = k * ctx0 * ctx0 + ctx0 * n * k * (k - 1) + n * n * (k - 1) * k * (2 * k - 1) / 6
        ms = _A * s2 / (kt * kt) + _B * s1 / kt + _C * k
        return ms / self.timing.speedup / 1000.0

    def cut(self, now: float) -> float | None:
        """An arrival at ``now``: a decode stretch ends with the step in progress, whose end is
        returned (an event now)."""
        st = self.step
        if st is not None and st.k > 1:
            self._advance(now)
            st.k = st.done + 1
            self.version += 1
            return st.end
        return None

    def finish_step(self, now: float) -> None:
        st = self.step
        assert st is not None
        if st.k > 1:
            self._advance(now)
            if st.done + 1 < st.k or st.end > now:  # an inner step ended: the stretch goes on
                return
            assert abs(now - st.end) < 1e-9
            j = st.done
            if st.alloc[j]:
                self.pool.allocate(st.alloc[j])
            step_s = self._step_s(st.ctx0 + j * st.decodes)
            self.sink.itl(step_s, st.decodes)
            self._decode_step_s = _ema(self._decode_step_s, step_s)
        else:
            assert abs(now - st.end) < 1e-9
        self.step = None
        if st.k > 1:
            self._finish_stretch(st)
        else:
            self._finish_one(st)
        finished = False
        for s, _ in st.sched:
            if not s.running or s.outputs < s.req.output_tokens:
                continue
            finished = True
            s.running = False
            s.finish_s = now
            self.pool.release(s.keyed, s.unkeyed)
            s.keyed, s.unkeyed = [], 0
            self.sink.finished(self, s, now)
        if finished:
            self.running = [s for s in self.running if s.running]
        if st.k == 1:
            step_s = st.end - st.start
            if st.decodes:
                self.sink.itl(step_s, st.decodes)
            self._observe(st.prefill, step_s)
        else:
            step_s = self._step_s(st.ctx0 + (st.k - 1) * st.decodes)
        self._publish(now, step_s, st.prefill + st.decodes, self._queued_prefill())

    def _finish_one(self, st: _Step) -> None:
        now = st.end
        for s, n in st.sched:
            if not s.running:
                continue
            s.computed += n
            self._offer(s)
            if s.computed == s.num_tokens:  # the chunk ended the sequence: a token is sampled
                s.outputs += 1
                if s.first_token_s < 0:
                    s.first_token_s = now
                    self.sink.first_token(self, s, now)

    def _finish_stretch(self, st: _Step) -> None:
        """``k`` decode steps done: each request computed and sampled ``k`` tokens; its share
        of the blocks the steps after the first allocated."""
        k, bs = st.k, self.block_size
        for s, _ in st.sched:
            s.unkeyed += _cdiv(s.computed + k, bs) - _cdiv(s.computed + 1, bs)
            s.computed += k
            s.outputs += k
            self._offer(s)

    def _offer(self, s: SimSeq) -> None:
        """Cache the request's blocks that became full (``KVCacheManager.cache_full_blocks``)."""
        full = s.computed // self.block_size
        start = s.offered
        if full <= start:
            return
        hashes = s.req.block_hashes
        if full <= len(hashes):
            keys: Sequence[int] = hashes[start:full]
        else:
            keys = [s.key(i) for i in range(start, full)]
        stored = self.pool.store_run(keys)
        s.unkeyed -= len(stored)
        s.keyed += stored
        s.offered = full

    def _observe(self, prefill: int, step_s: float) -> None:
        """The engine core's speed figures: prefill tokens/s and decode step time (EMAs)."""
        if prefill:
            self._prefill_tps = _ema(self._prefill_tps, prefill / step_s)
        else:
            self._decode_step_s = _ema(self._decode_step_s, step_s)

    def _queued_prefill(self) -> int:
        queued = self.waiting_tokens
        for s in self.running:
            left = s.req.prompt_tokens - s.computed
            if left > 0:
                queued += left
        return queued

    def _publish(self, now: float, step_s: float, tokens: int, queued: int) -> None:
        events = self.pool.take_events()
        if events and self.publish_events:
            self.sink.kv_events(self._batches.live(now, events))
        self._loads.offer(self._report(now, step_s, tokens, queued), now)

    def send_held_load(self, now: float) -> float | None:
        """The pacing interval ended: the held load report, if any, leaves now (a stretch's
        steps up to ``now`` first). Returns the stretch's next event, to schedule, if any."""
        st = self.step
        if st is None or st.k == 1:
            self._loads.due(now)
            return None
        self._advance(now)
        self._loads.due(now)
        t = self._next_event(st)
        if t is not None:
            self.version += 1  # an entry scheduled before stands for the same step or none
        return t

    def load_report(self, now: float) -> LoadReport:
        if self.step is not None and self.step.k > 1:
            self._advance(now)
        return self._report(now, 0.0, 0, self._queued_prefill())

    def _report(self, now: float, step_s: float, tokens: int, queued: int) -> LoadReport:
        return LoadReport(
            instance_id=self.instance_id,
            timestamp=now,
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            kv_blocks_used=self.pool.used,
            kv_blocks_total=self.num_blocks,
            queued_prefill_tokens=queued,
            step_time_s=step_s,
            tokens_computed=tokens,
            prefill_tokens_per_s=self._prefill_tps,
            decode_step_s=self._decode_step_s,
        )

    def snapshot(self, now: float) -> KVEventBatch:
        """The whole cache as a re-sync batch."""
        stored = BlockStored(
            block_hashes=tuple(self.pool.keys()), parent_block_hash=None, block_size=self.block_size
        )
        return self._batches.snapshot(now, (AllBlocksCleared(), stored))

    def check_integrity(self) -> None:
        self.pool.check()
        held = sum(s.num_blocks for s in self.running)
        if self.step is not None and self.step.k > 1:  # not yet shared out to the requests
            held += sum(self.step.alloc[: self.step.done])
        assert held == self.pool.used + self.pool.extra_refs(), "block refs"
        for s in self.running:
            assert s.num_blocks == _cdiv(s.computed, self.block_size) or self.step is not None


def _order(s: SimSeq) -> tuple[int, int]:
    return s.order


def _ema(old: float, new: float) -> float:
    return new if not old else (1 - _EMA) * old + _EMA * new
