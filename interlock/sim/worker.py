"""A fast simulated engine worker for trace replay: a prefix cache, a token-budget scheduler and
the mock step-time model (``interlock.engine.timing``), advanced by events, not per token.

Why not the real ``EngineCore`` with the mock runner: it is exact but steps one token of every
running request per Python call, and the conversation trace has 4 M output tokens across
hundreds of thousands of steps; replaying one hour must take seconds. So this model keeps only
what decides hits and latencies, with the same rules as the engine (vLLM v1 style):

* each step runs every decoding request for one token, then prompt chunks in admission order,
  then admits waiting requests first-come first-served, within ``max_num_batched_tokens`` and
  ``max_num_seqs``; a step costs ``TimingModel.step_s(prefill tokens, decodes, kv usage)``;
* a request is admitted only if its blocks (prompt + expected output, reserved up front, so no
  preemption) fit; its cached prefix (longest run of its block hashes in the cache, at least one
  token left to compute) is reused; computed prompt blocks become cached as soon as a chunk
  completes them, and published as ``BlockStored``; finished requests' blocks become evictable
  (LRU, a request's tail first) and evictions are published as ``BlockRemoved``; output blocks
  are cached as never-matching filler, as a real engine would cache them;
* with a host tier below the pool (``interlock.sim.tiers``), evicted blocks go there (and,
  written through, computed ones as soon as computed) and a lookup continues there after the
  pool's hits; loaded blocks count as hits and their load
  time is added to the admitting step;
* decode-only stretches (nothing to prefill or admit) are one *macro step* of ``k`` decode
  steps up to the next finish, timed in closed form (the decode time is a quadratic in KV
  usage, which grows linearly); an arrival during one cuts it at the step in progress.

Counters: ``computed`` is a request's prompt tokens computed (cached ones included);
``decode_ctx`` is the summed context of decoding requests; ``decode_steps`` counts decode steps.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from interlock.engine.timing import TimingModel, decode_ms
from interlock.protocol.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
    KVEventBatch,
    LoadReport,
)
from interlock.sim.tiers import SimTiers
from interlock.sim.trace import SimRequest

_A, _B, _C = -25.74, 54.01, 5.74
"""decode_ms(u) = A u^2 + B u + C on [0, 1] (checked against ``timing.decode_ms`` at import)."""
assert abs(decode_ms(0.5) - (_A * 0.25 + _B * 0.5 + _C)) < 1e-9


@dataclass(slots=True)
class SimSeq:
    req: SimRequest
    arrival_s: float
    hit_tokens: int = 0
    computed: int = 0
    held: list[int] = field(default_factory=list)
    """Registered block hashes this request references."""
    anon: int = 0
    """Blocks reserved without a hash (uncomputed, partial, or output)."""
    next_reg: int = 0
    first_token_s: float = -1.0
    finish_step: int = 0
    finish_s: float = -1.0


class WorkerSink:
    """What a worker tells the replay driver (override the ones you need)."""

    def first_token(self, worker: object, seq: SimSeq, t: float) -> None: ...
    def finished(self, worker: object, seq: SimSeq, t: float) -> None: ...
    def kv_events(self, batch: KVEventBatch) -> None: ...
    def load(self, report: LoadReport) -> None: ...
    def itl(self, step_s: float, tokens: int) -> None: ...


@dataclass(slots=True)
class _Step:
    start: float
    end: float
    chunks: list[tuple[SimSeq, int]]
    decodes: int
    k: int
    """Decode steps in this (macro) step; 1 for a step with prefill."""
    ctx0: int
    """decode_ctx at the start (for cutting a macro step)."""


class SimWorker:
    def __init__(self, instance_id: str, *, num_blocks: int, block_size: int = 64,
                 max_num_batched_tokens: int = 8192, max_num_seqs: int = 256,
                 timing: TimingModel | None = None, publish_events: bool = True,
                 sink: WorkerSink | None = None, tiers: SimTiers | None = None) -> None:
        self.instance_id = instance_id
        self.tiers = tiers
        self._load_s = 0.0
        """Load time of the requests admitted in the step being planned."""
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.max_tokens = max_num_batched_tokens
        self.max_seqs = max_num_seqs
        self.timing = timing or TimingModel()
        self.publish_events = publish_events
        self.sink = sink or WorkerSink()
        self._kv_tokens_total = num_blocks * block_size
        self.cached: dict[int, int] = {}
        """Registered block hash -> references by running requests."""
        self.lru: OrderedDict[int, None] = OrderedDict()
        """Registered, unreferenced blocks (evictable), oldest first."""
        self.used = 0
        """Blocks referenced by running requests (registered or anonymous)."""
        self.waiting: deque[SimSeq] = deque()
        self.prefilling: list[SimSeq] = []
        self.num_decoding = 0
        self.decode_ctx = 0
        self.decode_steps = 0
        self._finishes: list[tuple[int, int, SimSeq]] = []
        self._tie = 0
        self._filler = 0
        self.step: _Step | None = None
        self.version = 0
        """Bumped whenever the current step's end time changes (stale heap entries skipped)."""
        self._events: list[KVEvent] = []
        self._event_seq = 0
        self.queued_prefill = 0
        self._prefill_tok = 0.0
        self._prefill_time = 0.0
        self.hit_tokens = 0
        self.prompt_tokens = 0
        self._loaded: list[int] = []
        """Blocks loaded from the host tier in the step being planned (stored on the device)."""

    # ---- cache ----
    def free_blocks(self) -> int:
        return self.num_blocks - self.used - len(self.lru)

    def cached_prefix(self, hashes: tuple[int, ...], prompt_tokens: int) -> int:
        n = 0
        limit = (prompt_tokens - 1) // self.block_size
        cached, lru = self.cached, self.lru
        for h in hashes:
            if n >= limit or (h not in cached and h not in lru):
                break
            n += 1
        return n

    def _evict(self, n: int) -> None:
        removed = []
        for _ in range(n):
            h, _v = self.lru.popitem(last=False)
            if h >= 0:
                removed.append(h)
        if removed and self.publish_events:
            self._events.append(BlockRemoved(block_hashes=tuple(removed)))
        if removed and self.tiers is not None:
            self._to_host(removed)

    def _to_host(self, hashes: list[int]) -> None:
        assert self.tiers is not None
        stored, dropped = self.tiers.offload(hashes)
        if self.publish_events and stored:
            self._events.append(BlockStored(block_hashes=tuple(stored), parent_block_hash=None,
                                            block_size=self.block_size, tier="host"))
        if self.publish_events and dropped:
            self._events.append(BlockRemoved(block_hashes=tuple(dropped), tier="host"))

    def _try_admit(self, s: SimSeq) -> bool:
        r = s.req
        bs = self.block_size
        hit = self.cached_prefix(r.block_hashes, r.prompt_tokens)
        lower = 0
        if self.tiers is not None:
            limit = (r.prompt_tokens - 1) // bs
            lower = self.tiers.lookup(r.block_hashes[hit:max(limit, hit)])
        from_lru = sum(1 for h in r.block_hashes[:hit] if h in self.lru)
        total = -(-(r.prompt_tokens + r.output_tokens) // bs)
        new = total - hit
        if self.num_blocks - self.used - from_lru < new:
            return False
        for h in r.block_hashes[:hit]:
            if h in self.lru:
                del self.lru[h]
                self.cached[h] = 1
                self.used += 1
            else:
                self.cached[h] += 1
            s.held.append(h)
        if lower:  # touched first: this admission's own evictions must not push them out
            assert self.tiers is not None
            self._load_s += self.tiers.load(r.block_hashes[hit:hit + lower])
        short = new - self.free_blocks()
        if short > 0:
            self._evict(short)
        self.used += new
        s.anon = new
        hit += lower
        s.hit_tokens = s.computed = hit * bs
        s.next_reg = hit - lower
        if lower:
            self._register(s, self._loaded)
        self.queued_prefill -= s.hit_tokens
        self.hit_tokens += s.hit_tokens
        self.prompt_tokens += r.prompt_tokens
        return True

    def _register(self, s: SimSeq, stored: list[int]) -> None:
        hashes = s.req.block_hashes
        full = min(s.computed // self.block_size, len(hashes))
        for i in range(s.next_reg, full):
            h = hashes[i]
            if h in self.cached or h in self.lru:
                continue  # computed twice concurrently: ours stays anonymous
            self.cached[h] = 1
            s.anon -= 1
            s.held.append(h)
            stored.append(h)
        s.next_reg = max(s.next_reg, full)

    def _release(self, s: SimSeq) -> None:
        filler = min(s.req.output_tokens // self.block_size, s.anon)
        self.used -= s.anon
        for _ in range(filler):
            self._filler += 1
            self.lru[-self._filler] = None
        for h in reversed(s.held):
            c = self.cached[h] - 1
            if c:
                self.cached[h] = c
            else:
                del self.cached[h]
                self.lru[h] = None
                self.used -= 1
        s.held.clear()
        s.anon = 0

    # ---- requests ----
    def enqueue(self, req: SimRequest, now: float) -> SimSeq:
        s = SimSeq(req, now)
        self.waiting.append(s)
        self.queued_prefill += req.prompt_tokens
        return s

    @property
    def num_inflight(self) -> int:
        return len(self.waiting) + len(self.prefilling) + self.num_decoding

    # ---- stepping ----
    def start_step(self, now: float) -> float | None:
        """Plan the next step at ``now``; returns its end time, or None when idle."""
        budget = self.max_tokens - self.num_decoding
        chunks: list[tuple[SimSeq, int]] = []
        for s in self.prefilling:
            if budget <= 0:
                break
            take = min(s.req.prompt_tokens - s.computed, budget)
            chunks.append((s, take))
            budget -= take
        while budget > 0 and self.waiting and (
            len(self.prefilling) + self.num_decoding < self.max_seqs
        ):
            s = self.waiting[0]
            if not self._try_admit(s):
                break
            self.waiting.popleft()
            self.prefilling.append(s)
            take = min(s.req.prompt_tokens - s.computed, budget)
            chunks.append((s, take))
            budget -= take
        n_dec = self.num_decoding
        if self._loaded and self.publish_events:
            self._events.append(BlockStored(block_hashes=tuple(self._loaded), parent_block_hash=None,
                                            block_size=self.block_size))
        self._loaded = []
        load_s, self._load_s = self._load_s, 0.0
        if not chunks and not n_dec:
            self.step = None
            return None
        prefill = sum(t for _, t in chunks)
        k = 1
        if not chunks:
            k = max(1, self._finishes[0][0] - self.decode_steps)
        ctx_prefill = sum(s.computed + t for s, t in chunks)
        if chunks:
            u = (self.decode_ctx + ctx_prefill) / self._kv_tokens_total
            dur = self.timing.step_s(prefill, n_dec, u) + load_s
        else:
            dur = self._decode_span(self.decode_ctx, n_dec, k)
        self.step = _Step(now, now + dur, chunks, n_dec, k, self.decode_ctx)
        self.version += 1
        return self.step.end

    def _decode_span(self, ctx0: int, n: int, k: int) -> float:
        """Seconds for ``k`` decode-only steps starting at summed context ``ctx0``."""
        kt = self._kv_tokens_total
        s1 = k * ctx0 + n * k * (k - 1) / 2
        s2 = k * ctx0 * ctx0 + ctx0 * n * k * (k - 1) + n * n * (k - 1) * k * (2 * k - 1) / 6
        ms = _A * s2 / (kt * kt) + _B * s1 / kt + _C * k
        return ms / self.timing.speedup / 1000.0

    def cut(self, now: float) -> float | None:
        """An arrival at ``now``: end a decode macro step after the step in progress.
        Returns the new end time if it changed."""
        st = self.step
        if st is None or st.chunks or st.k <= 1:
            return None
        lo, hi = 0, st.k  # largest m with span(m) <= now - start
        elapsed = now - st.start
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._decode_span(st.ctx0, st.decodes, mid) <= elapsed:
                lo = mid
            else:
                hi = mid - 1
        m = min(lo + 1, st.k)
        if m == st.k:
            return None
        st.k = m
        st.end = st.start + self._decode_span(st.ctx0, st.decodes, m)
        self.version += 1
        return st.end

    def finish_step(self, now: float) -> None:
        st = self.step
        assert st is not None and abs(now - st.end) < 1e-9
        self.step = None
        if st.decodes:
            self.decode_steps += st.k
            self.decode_ctx += st.decodes * st.k
            self.sink.itl((st.end - st.start) / st.k, st.decodes * st.k)
            while self._finishes and self._finishes[0][0] <= self.decode_steps:
                _, _, s = heapq.heappop(self._finishes)
                self.num_decoding -= 1
                self.decode_ctx -= s.req.prompt_tokens + s.req.output_tokens
                self._finish(s, now)
        stored: list[int] = []
        prefill = 0
        for s, take in st.chunks:
            s.computed += take
            prefill += take
            self.queued_prefill -= take
            self._register(s, stored)
            if s.computed >= s.req.prompt_tokens:
                self.prefilling.remove(s)
                s.first_token_s = now
                self.sink.first_token(self, s, now)
                if s.req.output_tokens <= 1:
                    self._finish(s, now)
                else:
                    self.num_decoding += 1
                    self.decode_ctx += s.req.prompt_tokens + 1
                    s.finish_step = self.decode_steps + s.req.output_tokens - 1
                    self._tie += 1
                    heapq.heappush(self._finishes, (s.finish_step, self._tie, s))
        if prefill:
            self._prefill_tok = 0.8 * self._prefill_tok + prefill
            self._prefill_time = 0.8 * self._prefill_time + (st.end - st.start)
        if stored and self.publish_events:
            self._events.append(BlockStored(block_hashes=tuple(stored), parent_block_hash=None,
                                            block_size=self.block_size))
        if stored and self.tiers is not None and self.tiers.write_through:
            self._to_host(stored)
        self._publish(now, st)

    def _finish(self, s: SimSeq, now: float) -> None:
        s.finish_s = now
        self._release(s)
        self.sink.finished(self, s, now)

    def _publish(self, now: float, st: _Step) -> None:
        if self._events:
            self.sink.kv_events(KVEventBatch(instance_id=self.instance_id, seq=self._event_seq,
                                             timestamp=now, events=tuple(self._events)))
            self._event_seq += 1
            self._events = []
        tokens = sum(t for _, t in st.chunks) + st.decodes
        self.sink.load(self.load_report(now, (st.end - st.start) / st.k, tokens))

    def load_report(self, now: float, step_s: float = 0.0, tokens: int = 0) -> LoadReport:
        u = self.decode_ctx / self._kv_tokens_total
        tps = self._prefill_tok / self._prefill_time if self._prefill_time else 0.0
        return LoadReport(
            instance_id=self.instance_id, timestamp=now, num_running=len(self.prefilling)
            + self.num_decoding, num_waiting=len(self.waiting), kv_blocks_used=self.used,
            kv_blocks_total=self.num_blocks, queued_prefill_tokens=max(self.queued_prefill, 0),
            step_time_s=step_s, tokens_computed=tokens, prefill_tokens_per_s=tps,
            # What the engine's decode-step average converges to at this KV usage.
            decode_step_s=self.timing.step_s(0, 1, u),
        )

    def snapshot(self, now: float) -> KVEventBatch:
        """The whole cache as a re-sync batch."""
        hashes = tuple(h for h in (*self.cached, *self.lru) if h >= 0)
        # A snapshot carries the seq of the last batch it includes; live batches go on from +1.
        return KVEventBatch(instance_id=self.instance_id, seq=self._event_seq - 1, timestamp=now,
                            events=(AllBlocksCleared(), BlockStored(block_hashes=hashes,
                                                                    parent_block_hash=None)),
                            snapshot=True)

    def check_integrity(self) -> None:
        held = sum(len(s.held) + s.anon for s in self.prefilling)
        assert self.free_blocks() >= 0
        assert not (set(self.cached) & set(self.lru))
        assert held <= self.used

