"""``Router``: the decision-making part of the router, with no I/O (the async glue in
``interlock.router.service`` feeds it events, load reports and requests).

Per request: compute the prompt's block hashes, find the eligible workers, apply the overlays
(direct pin, session affinity, route-key subset), pick with the base policy, count the
dispatch at once (``LoadTracker``), and return a ``Decision`` that explains itself. When every
eligible worker is over its busy threshold (KV usage, requests in flight, or the queue depth the
worker registered) the request waits in a bounded priority queue
(``route`` returns a ``Pending``); the glue calls ``dispatch_queued`` after each finish or load
report to route whatever can go now.

Time is read through the ``clock`` callable so the trace-replay simulator can drive the router
on a virtual clock.
"""

from __future__ import annotations

import time
from array import array
from collections import deque
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from interlock.errors import ConfigError, InvalidRequest, NoWorkers, Overloaded
from interlock.kvchain import hash_blocks
from interlock.protocol import packed_ids
from interlock.protocol.discovery import InstanceInfo
from interlock.protocol.events import KVEventBatch, LoadReport, RouterLoadEvent
from interlock.router.admission import AdmissionQueue, Pending, RequestMeta
from interlock.router.cost import CostParams
from interlock.router.decision import Candidate, Decision, RouterMetrics
from interlock.router.indexer import ApplyResult, KvIndexer
from interlock.router.kv_decide import KvDecider, KvRequest, ReferenceDecider
from interlock.router.kv_lookup import RemoteChain, lookup_of
from interlock.router.load import LoadTracker
from interlock.router.policies import (
    POLICIES,
    SessionTable,
    pick_simple,
    rendezvous_subset,
    should_spill,
)
from interlock.router.route_kernel import CompiledDecider

MAX_SEEN_WORKERS = 65536


@dataclass(frozen=True)
class RouterConfig:
    policy: str = "kv"
    block_size: int = 16
    cost: CostParams = field(default_factory=CostParams)
    session_ttl_s: float = 600.0
    route_key_subset: int = 2
    spill_factor: float = 1.5
    max_inflight_per_worker: int = 0
    """Busy threshold in in-flight requests (0: no limit, never queue on count)."""
    busy_kv_usage: float = 0.98
    """A worker with this share of its KV blocks in use (as reported) is busy."""
    busy_kv_footprint: float = 2.0
    """A worker whose unfinished requests would need this many times its KV if each ran to
    its ``max_tokens`` (shared prefixes counted per request) is busy too: it bounds what waits
    in the engines' own queues, so overload reaches the router's bounded queue (and its 503s)."""
    queue_capacity: int = 1024
    max_queue_wait_s: float = 0.0
    """Refuse (``Overloaded``) a request that would wait longer than this in the queue,
    estimated as the requests ahead of it over the recent dispatch rate: a queue far longer
    than a service time only turns overload into a thrashed cache and timeouts. 0: only
    ``queue_capacity`` bounds the queue."""
    queue_scan: int = 16
    """Queued requests looked at per ``dispatch_queued`` call past ones waiting for a busy
    worker they prefer."""
    retry_after_s: float = 1.0
    approx_ttl_s: float = 120.0
    pending_ttl_s: float = 30.0
    """How long a request's blocks count as held on the worker it was routed to before that
    worker's KV events say so (``indexer``, pending prefixes; 0: not at all)."""
    num_candidates: int = 3
    report_lag_s: float = 0.0
    """A load report received at t is taken to include requests routed before t - lag."""
    share_load: bool = True
    """Keep dispatch events for ``drain_shared`` (several routers side by side). Whoever drives
    the router must then drain them; turn it off for a router nobody drains."""
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ConfigError(f"unknown router policy {self.policy!r}; choose from {POLICIES}")
        if self.max_queue_wait_s < 0 or self.busy_kv_footprint <= 0 or self.pending_ttl_s < 0:
            raise ConfigError("max_queue_wait_s and pending_ttl_s must be >= 0 and busy_kv_footprint > 0")
        if self.block_size < 1 or self.route_key_subset < 1 or self.queue_capacity < 0:
            raise ConfigError("block_size, route_key_subset must be positive, queue_capacity >= 0")
        if self.cost.block_size != self.block_size:
            object.__setattr__(self, "cost", replace(self.cost, block_size=self.block_size))


@dataclass(slots=True)
class _WorkerState:
    info: InstanceInfo
    slot: int
    healthy: bool = True
    """Last health signal (load report, ping, stream failure)."""
    blocked: bool = False
    """Held out by its circuit breaker (``router.breaker``), whatever its health says."""
    draining: bool = False


HASH_MEMO = 8
"""Long prompts whose block hashes a router keeps (by identity of their ids' tuple)."""
HASH_MEMO_TOKENS = packed_ids.MEMO_TOKENS
"""Prompts shorter than this are hashed every time (cheaper than looking)."""


class Router:
    def __init__(
        self,
        config: RouterConfig | None = None,
        *,
        router_id: str = "local",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config or RouterConfig()
        self.router_id = router_id
        self.clock = clock
        self.indexer = KvIndexer(
            approx_ttl_s=self.config.approx_ttl_s, pending_ttl_s=self.config.pending_ttl_s
        )
        self.load = LoadTracker(
            router_id,
            report_lag_s=self.config.report_lag_s,
            share=self.config.share_load,
            busy_kv_usage=self.config.busy_kv_usage,
            busy_kv_footprint=self.config.busy_kv_footprint,
            max_inflight=self.config.max_inflight_per_worker,
        )
        self.queue = AdmissionQueue(self.config.queue_capacity, self.config.retry_after_s)
        self.sessions = SessionTable(self.config.session_ttl_s)
        self.metrics = RouterMetrics()
        self._workers: dict[str, _WorkerState] = {}
        self._seen: dict[str, None] = {}
        """Every worker id this router has had (insertion order, bounded): a pin to one of them
        that is away (restarting, draining) is a 503 to retry, to any other id a 400."""
        self._slot_ids: dict[int, str] = {}
        self._hashed: deque[tuple[Sequence[int], list[int]]] = deque(maxlen=HASH_MEMO)
        """The last long prompts' ids and block hashes: a prompt the frontend encoded before is
        handed over as the same tuple (``frontend/chunked.py``), so it is not hashed again."""
        self._eligible_cache: dict[str | None, np.ndarray] = {}
        self._whole: list[np.ndarray] = []
        """The cached eligible masks that hold every slot (no costs to mask out)."""
        self._weight = np.ones(0)
        """Per slot: routing weight in (0, 1] (``set_weight``), 1 where never set."""
        self._weighted: set[int] = set()
        """Slots whose weight is not 1."""
        self._rng = np.random.default_rng(self.config.seed)
        reference = ReferenceDecider(
            self.indexer, self.load, self.config.cost, max(self.config.num_candidates, 2), self._rng
        )
        self.decider: KvDecider = CompiledDecider.for_router(reference) or reference
        """How the ``kv`` policy decides (``kv_decide``): compiled where it is built and
        decides as the reference does, else the reference; chosen once."""
        self._rotation = 0
        self._dispatch_times: deque[float] = deque(maxlen=64)
        """When the last requests were dispatched (the rate the queue drains at)."""
        self._queue_stamp: tuple[bytes, int] = (b"", -1)
        """Busy workers and queue length when ``dispatch_queued`` last looked."""
        self._revisit_at = np.inf
        """When the first request waiting for a busy worker would take another one."""
        self._routed: dict[str, str] = {}
        """request id -> worker id, for requests in flight."""

    # ---- membership and health ----
    def add_worker(self, info: InstanceInfo) -> None:
        if info.block_size != self.config.block_size:
            raise ConfigError(
                f"worker {info.instance_id} uses block_size {info.block_size}, "
                f"router expects {self.config.block_size}"
            )
        if info.instance_id in self._workers:
            self.remove_worker(info.instance_id)
        slot = self.indexer.add_worker(info.instance_id, publishes_events=info.publishes_kv_events)
        self.load.add_worker(
            slot,
            kv_blocks_total=info.kv_blocks_total,
            block_size=info.block_size,
            queue_limit=info.queue_depth_threshold,
        )
        self._workers[info.instance_id] = _WorkerState(info, slot)
        self._seen[info.instance_id] = None
        if len(self._seen) > MAX_SEEN_WORKERS:
            del self._seen[next(iter(self._seen))]
        self._slot_ids[slot] = info.instance_id
        self.set_weight(info.instance_id, 1.0)
        self._update_eligible(slot)

    def remove_worker(self, instance_id: str) -> None:
        w = self._workers.pop(instance_id, None)
        if w is None:
            return
        self.indexer.remove_worker(instance_id)
        self.load.remove_worker(w.slot)
        self.sessions.forget_worker(instance_id)
        del self._slot_ids[w.slot]
        for rid in [r for r, wid in self._routed.items() if wid == instance_id]:
            del self._routed[rid]
        self._update_eligible(w.slot)

    def take_stranded(self) -> list[RequestMeta]:
        """Take out of the queue the requests no registered worker could take (the last worker
        of their role left) and return them: the glue fails them at once, as it would a new
        request, instead of letting them wait out the queue timeout. A worker merely unhealthy,
        held by its circuit breaker or draining still counts: it comes back by itself (a load
        report, a probe) or leaves, and then its waiters fail."""
        waiting = self.queue.roles()
        if not waiting:
            return []
        roles: set[str | None] = {w.info.role for w in self._workers.values()}
        if "both" in roles:
            return []  # it takes any role
        if roles:
            roles.add(None)  # a request of no role takes any worker
        return self.queue.take_roles(waiting - roles)

    def set_health(self, instance_id: str, healthy: bool) -> None:
        w = self._workers.get(instance_id)
        if w is not None and w.healthy != healthy:
            w.healthy = healthy
            self._update_eligible(w.slot)

    def set_blocked(self, instance_id: str, blocked: bool) -> None:
        w = self._workers.get(instance_id)
        if w is not None and w.blocked != blocked:
            w.blocked = blocked
            self._update_eligible(w.slot)

    def set_weight(self, instance_id: str, weight: float) -> None:
        """Routing weight of a worker, in (0, 1]: the ``kv`` cost and the load that
        ``least-loaded`` and ``power-of-two`` compare are divided by it, so a worker at 0.25
        must look four times better to be chosen (the planner ramps a new, cold worker up from
        a low weight). ``round-robin`` and ``random`` ignore weights."""
        if not 0.0 < weight <= 1.0:
            raise ConfigError(f"routing weight must be in (0, 1], got {weight}")
        w = self._workers.get(instance_id)
        if w is None:
            return
        if w.slot >= len(self._weight):
            grown = np.ones(max(w.slot + 1, 2 * len(self._weight)))
            grown[: len(self._weight)] = self._weight
            self._weight = grown
        self._weight[w.slot] = weight
        if weight == 1.0:
            self._weighted.discard(w.slot)
        else:
            self._weighted.add(w.slot)

    def has_eligible(self, role: str | None = None) -> bool:
        """Some worker (of ``role``, or a ``both`` worker) could take a request now or later."""
        return bool(self._eligible(role).any())

    def is_eligible(self, instance_id: str) -> bool:
        w = self._workers.get(instance_id)
        return w is not None and w.healthy and not w.blocked and not w.draining

    def workers(self) -> list[str]:
        return list(self._workers)

    def weights_to_wake(self, role: str | None = None) -> str | None:
        """The prefetch of offloaded weights: a request arrived (not yet templated, tokenized or
        routed), and no eligible worker has its weights in and is free (none is warm, or every
        warm one is busy: the queue grows). Then the eligible worker whose weights come back
        soonest is the one to wake now; it is priced as warm from here on (its weights are on
        their way; its next report says how it went). None: nothing to wake."""
        load = self.load
        if not load.num_weights_out:
            return None
        eligible = self._eligible(role)
        waits = load.weights_wait_s[: len(eligible)]
        out = eligible & (waits > 0)
        if not out.any():
            return None
        warm = eligible & ~out
        if load.num_busy:
            warm &= ~self._busy_mask()
        if warm.any():
            return None
        slot = int(np.flatnonzero(out)[np.argmin(waits[out])])
        load.wake(slot)
        return self._slot_ids[slot]

    def wake_failed(self, instance_id: str) -> None:
        """The prefetch ``weights_to_wake`` asked for failed: price the worker's wait again."""
        slot = self._slot_of(instance_id)
        if slot is not None:
            self.load.wake_failed(slot)

    # ---- inputs from the planes ----
    def apply_events(self, batch: KVEventBatch) -> ApplyResult:
        """Apply a worker's KV events. On GAP the glue should ask that worker for a snapshot
        (``needs_resync`` lists who still needs one)."""
        res = self.indexer.apply(batch)
        if res is ApplyResult.GAP:
            self.metrics.resyncs_requested += 1
        elif res is ApplyResult.DUPLICATE:
            self.metrics.duplicate_batches += 1
        return res

    def load_state(
        self, instance_id: str, seq: int, tiers: Mapping[str, Sequence[int]]
    ) -> Generator[None, None, None]:
        """A worker's pulled state, applied a slice per ``next`` (``KvIndexer.load_state``)."""
        return self.indexer.load_state(instance_id, seq, tiers)

    def needs_resync(self) -> list[str]:
        return self.indexer.needs_resync()

    def tidy(self) -> None:
        """Background upkeep, every few tenths of a second: a growing index moves on."""
        self.indexer.tidy()

    def kv_seq(self, instance_id: str) -> int | None:
        return self.indexer.kv_seq(instance_id)

    def kv_export(self, instance_id: str) -> tuple[int, dict[str, list[int]]] | None:
        return self.indexer.export(instance_id)

    def apply_load(self, report: LoadReport) -> None:
        w = self._workers.get(report.instance_id)
        if w is None:
            return
        self.load.apply_report(w.slot, report, self.clock())
        if w.draining != report.draining:
            w.draining = report.draining
            self._update_eligible(w.slot)

    def apply_remote_load(self, ev: RouterLoadEvent) -> None:
        """Dispatch-time load shared by another router."""
        w = self._workers.get(ev.instance_id)
        self.load.apply_remote(ev, w.slot if w else None, self.clock())

    def drain_shared(self) -> list[RouterLoadEvent]:
        """This router's dispatch events for the other routers (the glue publishes them)."""
        out, self.load.outbox = self.load.outbox, []
        return out

    # ---- request lifecycle ----
    def block_hashes(self, token_ids: Sequence[int]) -> list[int]:
        """The prompt's block hashes (do not change the list: it may be shared)."""
        if len(token_ids) < HASH_MEMO_TOKENS:
            return hash_blocks(token_ids, self.config.block_size)
        for ids, hashes in self._hashed:
            if ids is token_ids:  # the very same object: equal, and nobody can change a tuple
                return hashes
        hashes = hash_blocks(token_ids, self.config.block_size)
        if isinstance(token_ids, tuple | array):  # an array: packed for the wire, never changed
            self._hashed.append((token_ids, hashes))
        return hashes

    def route(
        self,
        meta: RequestMeta,
        *,
        token_ids: Sequence[int] | None = None,
        block_hashes: Sequence[int] | None = None,
        may_wait: bool = True,
    ) -> Decision | Pending:
        """Decide now, or queue when every eligible worker is busy or, with ``may_wait``, when
        a busy one is worth waiting for (raises ``Overloaded`` when the queue is full,
        ``NoWorkers`` when no worker could ever take it). A probe that only wants to know
        where a request could go now passes ``may_wait=False``: with every eligible worker busy
        it gets a ``Pending`` that was never queued (nor counted as queued)."""
        hashes = block_hashes if block_hashes is not None else self.block_hashes(token_ids or ())
        now = self.clock()
        eligible = self._eligible(meta.role)
        if meta.worker_id is not None:
            return self._commit(self._direct(meta, hashes, eligible), meta, hashes, now)
        if not self._is_whole(eligible) and not eligible.any():
            raise NoWorkers("no healthy worker available", retry_after=self.config.retry_after_s)
        open_ = eligible & ~self._busy_mask() if self.load.num_busy else eligible
        if open_ is not eligible and not open_.any():
            if not may_wait:  # a probe: nothing free now is its answer
                return Pending((meta.priority, -1), meta, hashes, now)
            return self._wait(meta, hashes, now)
        d = self._decide(meta, hashes, open_, now, wait_for=eligible if may_wait else None)
        if d is None:  # a busy worker is worth waiting for
            return self._wait(meta, hashes, now)
        return self._commit(d, meta, hashes, now)

    def _wait(self, meta: RequestMeta, hashes: Sequence[int], now: float) -> Pending:
        try:
            self._check_queue_wait(now)
            p = self.queue.push(meta, hashes, now)
        except Overloaded:
            self.metrics.rejected += 1
            raise
        self.metrics.record_queued(meta.role)
        return p

    def _check_queue_wait(self, now: float) -> None:
        limit = self.config.max_queue_wait_s
        times = self._dispatch_times
        if not limit or not len(self.queue) or len(times) < 2 or now <= times[0]:
            return
        wait = len(self.queue) * (now - times[0]) / (len(times) - 1)
        if wait > limit:
            raise Overloaded(
                f"all workers busy and the queue's expected wait ({wait:.1f} s) is over {limit:g} s",
                retry_after=self.config.retry_after_s,
            )

    def dispatch_queued(self) -> list[Decision]:
        """Route queued requests, most important (lowest priority value) first, while some worker
        has room. A request keeps its preference (``kv``): if its best worker, priced with the
        wait for room (``cost.room_wait_s``), is a busy one, it stays queued for it as long as
        it has waited less than going elsewhere would cost it; requests behind it may go first
        (at most ``queue_scan`` of them looked at per call). Requests of a role whose workers
        are all busy are passed over while a request of another role waits behind them: a
        disaggregated request holding a prefill worker while it waits for a decode worker must
        not wait behind requests waiting for that prefill worker (a deadlock).

        Two passes. The first gives the room to the requests that would choose it anyway
        (each priced as if it had just arrived), of the most important priority waiting; only
        then do those that have waited long enough to give up their preference take what is
        left. In one pass, once the queue is long every request has waited past its give-up
        point, so each worker that opens takes whichever request is at the head, whatever it
        holds: under overload the hit ratio falls to round-robin's, the fleet's capacity with
        it, and the queue grows faster (RAG at x18: 0.51 of the hit ratio's 0.90 bound, 22
        against 37 requests/s at x16; with the first pass 0.81 and 42)."""
        out: list[Decision] = []
        now = self.clock()
        busy = self._busy_mask()
        stamp = (busy.tobytes(), len(self.queue))
        if stamp == self._queue_stamp and now < self._revisit_at:
            return out  # nothing opened, nothing queued, nobody's wait ran out: same answer
        self._revisit_at = np.inf
        for patient in (True, False):
            kept: list[Pending] = []
            closed: set[str | None] = set()
            first = self.queue.peek() if patient else None
            while (p := self.queue.peek(closed)) is not None and len(kept) < self.config.queue_scan:
                if first is not None and p.meta.priority != first.meta.priority:
                    break  # the first pass keeps to the most important requests waiting
                eligible = self._eligible(p.meta.role)
                open_ = eligible & ~busy
                if not open_.any():  # and it stays so in this call: dispatching only adds load
                    closed.add(p.meta.role)
                    continue
                self.queue.pop(closed)
                d = self._decide(
                    p.meta,
                    p.hashes,
                    open_,
                    now,
                    suffix="+queued",
                    wait_for=eligible,
                    waited_s=0.0 if patient else now - p.enqueued_at,
                )
                if d is None:
                    kept.append(p)
                    continue
                out.append(self._commit(d, p.meta, p.hashes, now))
                busy = self._busy_mask()
            for p in kept:
                self.queue.requeue(p)
        self._queue_stamp = (busy.tobytes(), len(self.queue))
        return out

    def cancel(self, request_id: str) -> None:
        """Client gone: drop it from the queue, or release its dispatched load."""
        if not self.queue.cancel(request_id):
            self.on_finish(request_id)

    def on_first_token(self, request_id: str) -> None:
        self.load.on_first_token(request_id, now=self.clock())

    def on_finish(self, request_id: str) -> None:
        self.load.on_finish(request_id, now=self.clock())
        self._routed.pop(request_id, None)

    # ---- internals ----
    def _eligible(self, role: str | None) -> np.ndarray:
        """Per slot: the worker may take a request of ``role`` (None: any) now or once it is not
        busy. Built once per role, then kept up to date one slot at a time (``_update_eligible``)."""
        cached = self._eligible_cache.get(role)
        if cached is not None:
            return cached
        mask = np.zeros(self.indexer.num_slots, dtype=bool)
        for w in self._workers.values():
            mask[w.slot] = _takes(w, role)
        self._eligible_cache[role] = mask
        if len(mask) and mask.all():
            self._whole.append(mask)
        return mask

    def _is_whole(self, mask: np.ndarray) -> bool:
        for m in self._whole:
            if m is mask:
                return True
        return False

    def _update_eligible(self, slot: int) -> None:
        """The worker in ``slot`` (or none: it left) changed: set its bit in every cached mask,
        which grows with the slots (a join or a leave costs no walk over the fleet)."""
        n = self.indexer.num_slots
        sid = self._slot_ids.get(slot)
        w = self._workers.get(sid) if sid is not None else None
        self._whole.clear()
        for role, mask in list(self._eligible_cache.items()):
            if len(mask) != n:  # new slots: a new mask object (cached costs keyed by it stay right)
                grown = np.zeros(n, dtype=bool)
                grown[: min(len(mask), n)] = mask[:n]
                self._eligible_cache[role] = mask = grown
            if slot < n:
                mask[slot] = w is not None and _takes(w, role)
            if n and mask.all():
                self._whole.append(mask)

    def _weights(self, n: int) -> np.ndarray | None:
        """Per-slot routing weights for ``n`` slots, None when all are 1 (the common case)."""
        if not self._weighted:
            return None
        w = self._weight[:n]
        return np.concatenate([w, np.ones(n - len(w))]) if len(w) < n else w

    def _busy_mask(self) -> np.ndarray:
        """Busy: KV blocks in use at ``busy_kv_usage``, ``busy_kv_footprint`` times its KV
        dispatched, ``max_inflight_per_worker`` in flight, or more requests waiting in its queue
        than the worker's ``queue_depth_threshold`` (``LoadTracker`` keeps the mark up to date).
        Blocks in use as reported: prompts sent since wait in the engine's queue, not in its KV
        (the queue has its own criterion), and the dispatched footprint counts a shared prefix
        once per request and whole outputs up front."""
        return self.load.busy_mask()[: self.indexer.num_slots]

    def _direct(self, meta: RequestMeta, hashes: Sequence[int], eligible: np.ndarray) -> Decision:
        w = self._workers.get(meta.worker_id or "")
        if w is None and meta.worker_id not in self._seen:
            raise InvalidRequest(
                f"no worker {(meta.worker_id or '')[:64]!r} serves this model", param="x-worker-id"
            )
        if w is None or not eligible[w.slot]:
            raise NoWorkers(
                f"worker {meta.worker_id!r} is not available", retry_after=self.config.retry_after_s
            )
        return self._decision(meta, w.info.instance_id, "direct", self._overlap(hashes, w.slot))

    def _decide(
        self,
        meta: RequestMeta,
        hashes: Sequence[int],
        open_: np.ndarray,
        now: float,
        suffix: str = "",
        wait_for: np.ndarray | None = None,
        waited_s: float = 0.0,
    ) -> Decision | None:
        """The worker for ``meta`` among ``open_``; None when, with ``wait_for`` (the eligible
        workers, busy ones included), the request is better off waiting for a busy one."""
        t0 = time.perf_counter()
        if self.indexer.num_approx:
            self.indexer.expire(now)
        if self.indexer.pending_waiting:
            self.indexer.expire_pending(now)
        self._rotation += 1
        if meta.session_id is not None:
            wid = self.sessions.get(meta.session_id, now)
            w = self._workers.get(wid) if wid else None
            if w is not None and open_[w.slot]:
                ov = self._overlap(hashes, w.slot)
                return self._decision(meta, w.info.instance_id, "session" + suffix, ov, t0=t0)
        reason = self.config.policy
        mask = open_
        if meta.route_key is not None:
            mask, reason = self._route_key_mask(meta.route_key, open_)
        d = self._pick(
            meta,
            hashes,
            mask,
            reason + suffix,
            t0,
            wait_for=wait_for if meta.route_key is None else None,
            waited_s=waited_s,
        )
        if d is None:
            return None
        if meta.session_id is not None:
            self.sessions.put(meta.session_id, d.worker_id, now)
        return d

    def _route_key_mask(self, key: str, open_: np.ndarray) -> tuple[np.ndarray, str]:
        ids = [wid for wid, w in self._workers.items() if open_[w.slot]]
        subset = rendezvous_subset(key, ids, self.config.route_key_subset)
        mask = np.zeros_like(open_)
        for wid in subset:
            mask[self._workers[wid].slot] = True
        busy = self.load.busy()[: len(open_)]
        if should_spill(busy[mask], busy[open_], self.config.spill_factor):
            return open_, "route_key-spill"
        return mask, "route_key"

    def _pick(
        self,
        meta: RequestMeta,
        hashes: Sequence[int],
        mask: np.ndarray,
        reason: str,
        t0: float,
        wait_for: np.ndarray | None = None,
        waited_s: float = 0.0,
    ) -> Decision | None:
        """The worker for ``meta`` among ``mask`` by the base policy; None when, with
        ``wait_for``, the request is better off waiting for a worker outside ``mask``."""
        n = len(mask)
        weight = self._weights(n)
        if self.config.policy != "kv":
            slot = self._pick_simple(mask, weight)
            return self._decision(meta, self._slot_ids[slot], reason, self._overlap(hashes, slot), t0=t0)
        req = KvRequest(
            hashes, meta.prompt_tokens, meta.max_tokens, mask, self._is_whole(mask), weight,
            self._rotation, len(self._workers), lookup_of(hashes, self._slot_of, n),
        )  # fmt: skip
        choice = self.decider.decide(req)
        slot, held = choice.slot, choice.held
        if wait_for is not None and wait_for is not mask:
            verdict = self._wait_verdict(choice.costs, slot, mask, wait_for, waited_s)
            if verdict == "wait":
                return None
            if verdict == "gave_up":
                reason += "+gave_up"
        ids, cost = self._slot_ids, choice.costs.item
        cands = tuple(
            [Candidate(ids[s], cost(s), held(s)) for s in choice.ranked[: self.config.num_candidates]]
        )
        return self._decision(meta, ids[slot], reason, held(slot), t0=t0, candidates=cands)

    def _overlap(self, hashes: Sequence[int], slot: int) -> int:
        """Leading blocks of ``hashes`` the worker at ``slot`` holds: as a replica answered
        (``kv_lookup.RemoteChain``), else as this router's index has it."""
        if isinstance(hashes, RemoteChain):
            return hashes.holders.get(self._slot_ids[slot], (0, 0))[0]
        return int(self.indexer.overlaps(hashes)[slot]) if hashes else 0

    def _slot_of(self, instance_id: str) -> int | None:
        w = self._workers.get(instance_id)
        return w.slot if w is not None else None

    def kv_holders(self, hashes: Sequence[int]) -> tuple[list[str], list[int], list[int] | None]:
        """The workers holding a prefix of ``hashes`` in this router's index: (their ids, the
        leading device blocks each holds, the lower-tier blocks right after those; None
        without lower tiers). What a ``kv_lookup`` replies (``kv_lookup.py``)."""
        ix = self.indexer
        n = ix.num_slots
        device = ix.overlaps(hashes, n)
        lower = ix.lower_overlaps(hashes, n) if ix.has_lower_tiers() else None
        slots = np.flatnonzero(device if lower is None else device + lower)
        ids = self._slot_ids
        return (
            [ids[s] for s in slots.tolist()],
            device[slots].tolist(),
            lower[slots].tolist() if lower is not None else None,
        )

    def _pick_simple(self, mask: np.ndarray, weight: np.ndarray | None) -> int:
        """The slot a policy other than ``kv`` picks (``policies.pick_simple``)."""
        n = len(mask)
        busy = self.load.busy()[:n]
        queued = self.load.queued_prefill()[:n]
        if weight is not None:
            busy, queued = (busy + 1) / weight, (queued + 1) / weight
        return pick_simple(self.config.policy, mask, busy, queued, self._rng, self._rotation)

    def _wait_verdict(
        self, costs: np.ndarray, slot: int, mask: np.ndarray, wait_for: np.ndarray, waited_s: float
    ) -> str:
        """ "wait" for a busy worker (in ``wait_for``, not in ``mask``) while what the request
        has waited is less than what the busy one saves over ``slot`` (marking when to look
        again); "gave_up" once it has waited that long (it takes ``slot``, its cache elsewhere:
        counted as a decision reason); "go" where no busy worker would serve it better."""
        closed = wait_for & ~mask
        if not closed.any():
            return "go"
        best_closed = float(costs[closed].min())
        gap = float(costs[slot]) - self.config.cost.tie_tolerance_s - best_closed
        if waited_s >= gap:
            return "gave_up" if gap > 0 else "go"
        self._revisit_at = min(self._revisit_at, self.clock() + gap - waited_s)
        return "wait"

    def _decision(
        self,
        meta: RequestMeta,
        worker_id: str,
        reason: str,
        overlap: int,
        *,
        t0: float | None = None,
        candidates: tuple[Candidate, ...] = (),
    ) -> Decision:
        took = time.perf_counter() - t0 if t0 is not None else 0.0
        return Decision(
            meta.request_id,
            worker_id,
            reason,
            overlap,
            meta.prompt_tokens,
            self.config.block_size,
            candidates,
            took,
            self.indexer.loading,
        )

    def _commit(self, d: Decision, meta: RequestMeta, hashes: Sequence[int], now: float) -> Decision:
        w = self._workers[d.worker_id]
        prompt = meta.prompt_tokens
        cached = d.overlap_blocks * d.block_size  # d.cached_tokens, without the property's call
        if cached > prompt:
            cached = prompt
        prefill = prompt - cached if prompt - cached > 1 else 1
        self.load.on_route(
            meta.request_id,
            w.slot,
            d.worker_id,
            prefill_tokens=prefill,
            kv_tokens=prompt + meta.max_tokens,
            now=now,
        )
        if self.indexer.num_approx:
            self.indexer.record_routed(d.worker_id, hashes, now)
        if self.config.policy == "kv" and not isinstance(hashes, RemoteChain):  # others read no index
            self.indexer.record_pending(d.worker_id, hashes, now)
        self._routed[meta.request_id] = d.worker_id
        self._dispatch_times.append(now)
        self.metrics.record(d)
        return d


def _takes(w: _WorkerState, role: str | None) -> bool:
    """``w`` may take a request of ``role`` (None: any) now or once it is not busy."""
    return w.healthy and not w.blocked and not w.draining and (role is None or w.info.role in (role, "both"))
