"""Per-worker load as the router sees it: its own dispatches merged with workers' reports.

Why dispatch-time accounting: load reports arrive every few tens of milliseconds, and a burst
of requests arriving in between would all see the same idle worker and herd onto it. So the
router counts what it sends, at once: on route the request's uncached prompt tokens join the
worker's prefill queue and its KV tokens join the worker's footprint; at the first token the
prefill part is done; at the end everything is released. Other routers (several frontends side
by side) share the same three moments as ``RouterLoadEvent`` messages; they are counted the
same way under their router id.

Merging with a ``LoadReport``: the report is the truth about what the worker had received
(including how far a long prompt's chunked prefill has got), so the queue ahead of a new request
is the last report's queue plus the prefill dispatched since that report arrived ("fresh"
dispatches; a report received at t covers requests routed before t - ``report_lag_s``).
Before any report that is just the dispatch count. Speeds (prefill tokens/s, decode step time)
come only from reports, with defaults until the first one.

State is kept in numpy vectors indexed by the indexer's worker slot so the cost function runs
vectorised over all workers. Every vector a routing decision reads (queue ahead, queue depth,
in-flight count, KV usage, blocks in use and free, the busy mark, the speed lines) is kept up
to date slot by slot as dispatches and reports arrive, so a decision reads them as they are
and never rebuilds them from per-worker state (issue 10 item 7: a decision at 1,024 workers
has a budget of about 50 µs). ``check_derived`` recomputes them from scratch, for tests.
Where the router's compiled module builds (``router.native``), a dispatch, first token or
finish updates its slot in one compiled call, and so do a load report's figures
(``csrc/account.c``, the same doubles as the Python here, which stays the reference and the
fallback). A report costs a few µs at any fleet size (``benchmarks/router_decision.py
--reports``): every worker sends several a second, and a simulated one sends one per engine step.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import numpy as np

from interlock.protocol.events import LoadReport, RouterLoadEvent
from interlock.router import native
from interlock.router.speed import StepTimeFit

DEFAULT_PREFILL_TPS = 10_000.0
"""Assumed prefill speed (tokens/s) before any worker has reported one."""
DEFAULT_DECODE_STEP_S = 0.02
DEFAULT_STEP_OVERHEAD_S = 0.02
DEFAULT_LOAD_S_PER_BLOCK = 1e-3
"""Until a worker reports a measured one: a pessimistic host/disk load of one block (measured:
about 0.05 ms from host and 0.2 ms from disk for a 0.7 MB SmolLM2 block here)."""
DECODE_CONTEXT_SLOPE = 4.0
"""Prior for how decode step time grows with a worker's summed context (as a fraction of its KV
tokens) until the fleet's reports fit a line: x5 from empty to full (Dynamo's mocker fit, a
memory-bound decode, gives x6)."""
MAX_DECODE_CONTEXT = 1.0
"""Most context a worker's decode step reads, over its KV tokens: the dispatched footprint
includes requests waiting in the engine's queue, which read nothing until there is room (a
saturated worker's footprint runs to 3-4x its KV), and the step time's line must not be
extrapolated there (it priced 0.2 s steps where the engine's longest is 34 ms)."""


class _Dispatched(msgspec.Struct, gc=False):
    """One dispatched request. A Struct built in C, not a dataclass (whose ``__init__`` is a
    Python call, a few tenths of a microsecond of every decision); strings and numbers only, so
    the garbage collector need not track it."""

    slot: int
    instance_id: str
    prefill_tokens: int
    kv_tokens: int
    routed_at: float
    prefill_done: bool = False
    fresh: bool = True
    """Not yet covered by a load report from its worker."""


_NO_DELTAS = (None,) * 6
"""``account``'s deltas that change nothing: only the slot's derived values recomputed."""

_VECTORS: tuple[tuple[str, float, type], ...] = (
    # state
    ("dispatched_prefill", 0.0, float),
    ("dispatched_kv", 0.0, float),
    ("inflight", 0.0, float),
    ("decoding", 0.0, float),
    ("reported_prefill", 0.0, float),
    ("reported_running", 0.0, float),
    ("reported_waiting", 0.0, float),
    ("fresh_prefill", 0.0, float),
    ("fresh_count", 0.0, float),
    ("kv_used_frac", 0.0, float),
    ("kv_tokens_total", 0.0, float),
    ("inv_kv_tokens", 0.0, float),
    ("prefill_tps", DEFAULT_PREFILL_TPS, float),
    ("decode_step_s", DEFAULT_DECODE_STEP_S, float),
    ("load_s_per_block", DEFAULT_LOAD_S_PER_BLOCK, float),
    ("weights_wait_s", 0.0, float),
    ("decode_measured", False, bool),
    ("report_time", -np.inf, float),
    ("_block_size", 16.0, float),
    ("_queue_limit", np.inf, float),
    ("_fit_a", DEFAULT_STEP_OVERHEAD_S, float),
    ("_fit_b", 1.0 / DEFAULT_PREFILL_TPS, float),
    ("_fitted", False, bool),
    # derived from the state of the same slot (``_refresh``)
    ("_queued", 0.0, float),
    ("_depth", 0.0, float),
    ("_busy_n", 0.0, float),
    ("_usage", 0.0, float),
    ("_context", 0.0, float),
    ("_prior", 1.0, float),
    ("_used", 0.0, float),
    ("_free", np.inf, float),
    ("_busy", False, bool),
)
"""Every per-slot vector, with its value for a slot without a worker."""
ACCOUNT_VECTORS = (
    # the state a dispatch, first token or finish changes (``_deltas``' order)
    "dispatched_prefill",
    "fresh_prefill",
    "fresh_count",
    "dispatched_kv",
    "inflight",
    "decoding",
    # read
    "reported_waiting",
    "reported_running",
    "inv_kv_tokens",
    "kv_used_frac",
    "reported_prefill",
    "_queue_limit",
    "kv_tokens_total",
    "_block_size",
    # derived
    "_queued",
    "_depth",
    "_busy_n",
    "_usage",
    "_context",
    "_prior",
    "_used",
    "_free",
    "_busy",
)
"""The vectors the compiled accounting (``csrc/account.c``: ``account`` and ``report``) reads
and writes, in its order."""


class LoadTracker:
    """Dispatch-time load plus the latest report, per worker slot.

    ``busy_kv_usage``, ``busy_kv_footprint`` and ``max_inflight`` define the busy mark
    (``busy_mask``): a worker with that share of its KV blocks in use as reported, or whose
    unfinished requests would need that many times its KV if each ran to its ``max_tokens``, or
    with that many requests in flight (0: no limit), or with more requests waiting than the
    ``queue_limit`` it was added with."""

    dispatched_prefill: np.ndarray
    """Uncached prompt tokens dispatched and not yet past their first token."""
    dispatched_kv: np.ndarray
    """KV tokens (prompt + expected output) of dispatched, unfinished requests."""
    inflight: np.ndarray
    decoding: np.ndarray
    reported_prefill: np.ndarray
    reported_running: np.ndarray
    reported_waiting: np.ndarray
    fresh_prefill: np.ndarray
    """Prefill dispatched since the worker's last report (not in reported_prefill yet)."""
    fresh_count: np.ndarray
    """Requests dispatched since the worker's last report (the ones behind fresh_prefill)."""
    kv_used_frac: np.ndarray
    kv_tokens_total: np.ndarray
    inv_kv_tokens: np.ndarray
    """1 / kv_tokens_total (0 when unknown), so usage is one multiply."""
    prefill_tps: np.ndarray
    decode_step_s: np.ndarray
    load_s_per_block: np.ndarray
    """Measured seconds to load one KV block from the worker's lower tiers (host, disk)."""
    weights_wait_s: np.ndarray
    """Seconds the worker's next request waits for its model's weights to load again (it
    offloaded them while idle: ``LoadReport.weights_load_s``); 0 while they are in."""
    decode_measured: np.ndarray
    """The worker has reported a decode step time (until then it is priced like the fleet)."""
    report_time: np.ndarray
    _block_size: np.ndarray
    _queue_limit: np.ndarray
    """Busy past this many waiting requests (+inf: no limit)."""
    _fit_a: np.ndarray
    _fit_b: np.ndarray
    _fitted: np.ndarray
    """The slot's own speed line (``_fit_a`` + tokens * ``_fit_b``) exists."""
    _queued: np.ndarray
    _depth: np.ndarray
    _busy_n: np.ndarray
    _usage: np.ndarray
    _context: np.ndarray
    """``context_usage`` of the slot: summed context over KV tokens, at most ``MAX_DECODE_CONTEXT``."""
    _prior: np.ndarray
    """``1 + DECODE_CONTEXT_SLOPE * context``: the prior's decode-step growth factor."""
    _used: np.ndarray
    _free: np.ndarray
    _busy: np.ndarray

    def __init__(
        self,
        router_id: str = "local",
        capacity: int = 64,
        report_lag_s: float = 0.0,
        share: bool = True,
        *,
        busy_kv_usage: float = 0.98,
        busy_kv_footprint: float = 2.0,
        max_inflight: int = 0,
        compiled: bool = True,
    ) -> None:
        self.router_id = router_id
        self.share = share
        """Record this router's dispatches in ``outbox`` for other routers (off: nothing kept)."""
        self.report_lag_s = report_lag_s
        """A report received at t covers requests routed before t - report_lag_s."""
        self.busy_kv_usage = busy_kv_usage
        self.busy_kv_footprint = busy_kv_footprint
        self.max_inflight = max_inflight
        self._fresh: dict[int, list[str | tuple[str, str]]] = {}
        self._inflight: dict[str | tuple[str, str], _Dispatched] = {}
        """Requests in flight: this router's by request id, another router's by (router id,
        request id) (``_key``)."""
        for name, fill, dtype in _VECTORS:
            setattr(self, name, np.full(capacity, fill, dtype=dtype))
        self._num_busy = 0
        self.num_weights_out = 0
        """Slots with ``weights_wait_s`` above 0 (while there are none it is never read)."""
        self._woken: dict[int, tuple[float, float]] = {}
        """Slots woken by a prefetch (``wake``): the time of their last report then (a report
        no newer says the weights are out only because it was sent before the wake), and the
        wait it priced."""
        self._num_measured = 0
        """Slots with ``decode_measured`` set."""
        self._fits: dict[int, StepTimeFit] = {}
        """The workers' slots, with their speed fits."""
        self._num_fitted = 0
        self._speeds: tuple[np.ndarray, np.ndarray] | None = None
        self._decode_fit = StepTimeFit(decay=0.99)
        """Fleet-wide line: decode step seconds against KV usage (0..1)."""
        self._decode_line: tuple[float, float] | None = None
        self._decode_line_stale = True
        self._fastest_decode: float | None = None
        """Fastest decode step any worker reported (None: to be found again)."""
        self._step = np.empty(0)
        """``decode_step``'s result, rewritten by each call."""
        self.outbox: list[RouterLoadEvent] = []
        """Events for other routers; the glue drains and publishes them."""
        module = native.load() if compiled else None
        self._account = module.account if module is not None else None
        """The compiled accounting of one slot (``csrc/account.c``), None: the Python."""
        self._report: Callable[..., int] | None = module.report if module is not None else None
        """The compiled figures of a load report (``csrc/account.c``), with ``_account``."""
        self._account_vectors: tuple[np.ndarray, ...] = ()
        self._limits = (
            float(busy_kv_usage),
            float(busy_kv_footprint),
            float(max_inflight),
            MAX_DECODE_CONTEXT,
            DECODE_CONTEXT_SLOPE,
        )
        self._bind_vectors()

    def _bind_vectors(self) -> None:
        """``ACCOUNT_VECTORS`` as they are now (after a growth, the new arrays)."""
        self._account_vectors = tuple(getattr(self, name) for name in ACCOUNT_VECTORS)

    # ---- membership ----
    def add_worker(
        self, slot: int, *, kv_blocks_total: int = 0, block_size: int = 16, queue_limit: int = 0
    ) -> None:
        """Register a worker at ``slot``, with nothing in flight or reported. ``queue_limit``:
        busy while more requests than this wait in its queue (0: never)."""
        self._reset(slot)
        self._fits[slot] = StepTimeFit()
        self.kv_tokens_total[slot] = kv_blocks_total * block_size
        self.inv_kv_tokens[slot] = 1.0 / (kv_blocks_total * block_size) if kv_blocks_total else 0.0
        self._block_size[slot] = block_size
        self._queue_limit[slot] = queue_limit if queue_limit > 0 else np.inf
        self._refresh(slot)

    def remove_worker(self, slot: int) -> None:
        for key in [k for k, d in self._inflight.items() if d.slot == slot]:
            del self._inflight[key]
        self._reset(slot)
        self._refresh(slot)

    def _reset(self, slot: int) -> None:
        self._grow(slot + 1)
        self._fresh[slot] = []
        self._num_fitted -= bool(self._fitted[slot])
        self._num_busy -= bool(self._busy[slot])
        self._num_measured -= bool(self.decode_measured[slot])
        self.num_weights_out -= bool(self.weights_wait_s[slot])
        self._woken.pop(slot, None)
        for name, fill, _ in _VECTORS:
            getattr(self, name)[slot] = fill
        self._fits.pop(slot, None)
        self._speeds = None
        self._fastest_decode = None

    def _grow(self, n: int) -> None:
        size = len(self.inflight)
        if n <= size:
            return
        extra = max(n, 2 * size) - size
        for name, fill, dtype in _VECTORS:
            setattr(self, name, np.concatenate([getattr(self, name), np.full(extra, fill, dtype=dtype)]))
        self._speeds = None
        self._bind_vectors()

    def _refresh(self, s: int, blocks: bool = True) -> None:
        """Recompute slot ``s``'s derived values from its state (same arithmetic as the
        vectorised definitions in ``check_derived``); ``blocks=False`` after a dispatch, which
        leaves the reported blocks in use as they were."""
        if blocks:
            total = self.kv_tokens_total.item(s) / self._block_size.item(s)
            self._used[s] = used = self.kv_used_frac.item(s) * total
            self._free[s] = total - used if total > 0 else np.inf
        if self._account is not None:  # ``_derive`` compiled: no deltas, the slot derived
            self._num_busy += self._account(self._account_vectors, s, _NO_DELTAS, self._limits)
            return
        self._derive(
            s,
            self.fresh_prefill.item(s),
            self.fresh_count.item(s),
            self.inflight.item(s),
            self.dispatched_kv.item(s),
        )

    def _derive(
        self, s: int, fresh_prefill: float, fresh_count: float, inflight: float, dispatched_kv: float
    ) -> None:
        """``_refresh`` but for the blocks in use, given the slot's dispatch state (``on_route``
        has it at hand: four reads fewer)."""
        # max/min spelled out (the same first-of-equals choice as the builtins, without a call)
        depth = self.reported_waiting.item(s) + fresh_count
        running = self.reported_running.item(s)
        n = running if running > inflight else inflight
        footprint = dispatched_kv * self.inv_kv_tokens.item(s)
        used_frac = self.kv_used_frac.item(s)
        usage = footprint if footprint > used_frac else used_frac
        self._queued[s] = self.reported_prefill.item(s) + fresh_prefill
        self._depth[s] = depth
        self._busy_n[s] = n
        self._usage[s] = usage
        context = MAX_DECODE_CONTEXT if MAX_DECODE_CONTEXT < footprint else footprint
        self._context[s] = context
        self._prior[s] = 1.0 + DECODE_CONTEXT_SLOPE * context
        busy = (
            used_frac >= self.busy_kv_usage
            or usage >= self.busy_kv_footprint
            or (self.max_inflight and n >= self.max_inflight)
            or depth > self._queue_limit.item(s)
        )
        if busy != self._busy.item(s):
            self._busy[s] = busy
            self._num_busy += 1 if busy else -1

    # ---- dispatch accounting (this router, or another one via apply_remote) ----
    def on_route(
        self,
        request_id: str,
        slot: int,
        instance_id: str,
        *,
        prefill_tokens: int,
        kv_tokens: int,
        now: float,
        router_id: str | None = None,
    ) -> None:
        key = self._key(request_id, router_id) if router_id else request_id
        if key in self._inflight:
            return
        self._inflight[key] = _Dispatched(slot, instance_id, prefill_tokens, kv_tokens, now)
        fresh = self._fresh.get(slot)
        if fresh is None:
            fresh = self._fresh[slot] = []
        fresh.append(key)
        if self._account is not None:
            deltas = (prefill_tokens, prefill_tokens, 1, kv_tokens, 1, None)
            self._num_busy += self._account(self._account_vectors, slot, deltas, self._limits)
        else:
            # the same doubles as ``v[slot] += x``, without a numpy scalar each
            s = slot
            v = self.dispatched_prefill
            v[s] = v.item(s) + prefill_tokens
            v = self.fresh_prefill
            v[s] = fresh_prefill = v.item(s) + prefill_tokens
            v = self.fresh_count
            v[s] = fresh_count = v.item(s) + 1
            v = self.dispatched_kv
            v[s] = dispatched_kv = v.item(s) + kv_tokens
            v = self.inflight
            v[s] = inflight = v.item(s) + 1
            self._derive(s, fresh_prefill, fresh_count, inflight, dispatched_kv)
        if router_id is None and self.share:
            self.outbox.append(
                RouterLoadEvent(
                    router_id=self.router_id,
                    instance_id=instance_id,
                    request_id=request_id,
                    kind="route",
                    timestamp=now,
                    prefill_tokens=prefill_tokens,
                    kv_tokens=kv_tokens,
                )
            )

    def on_first_token(self, request_id: str, *, now: float = 0.0, router_id: str | None = None) -> None:
        d = self._inflight.get(self._key(request_id, router_id) if router_id else request_id)
        if d is None or d.prefill_done:
            return
        d.prefill_done = True
        s = d.slot
        if self._account is not None:
            p = -d.prefill_tokens
            fresh = d.fresh
            d.fresh = False
            deltas = (p, p if fresh else None, -1 if fresh else None, None, None, 1)
            self._num_busy += self._account(self._account_vectors, s, deltas, self._limits)
        else:
            v = self.dispatched_prefill
            v[s] = v.item(s) - d.prefill_tokens
            self._unfresh(d)
            v = self.decoding
            v[s] = v.item(s) + 1
            self._refresh(s, blocks=False)
        if router_id is None:
            self._share(request_id, d.instance_id, "first_token", now)

    def on_finish(self, request_id: str, *, now: float = 0.0, router_id: str | None = None) -> None:
        d = self._inflight.pop(self._key(request_id, router_id) if router_id else request_id, None)
        if d is None:
            return
        s = d.slot
        if self._account is not None:
            done, fresh, p = d.prefill_done, d.fresh, -d.prefill_tokens
            d.fresh = False
            deltas = (
                None if done else p,
                p if fresh else None,
                -1 if fresh else None,
                -d.kv_tokens,
                -1,
                -1 if done else None,
            )
            self._num_busy += self._account(self._account_vectors, s, deltas, self._limits)
        else:
            if d.prefill_done:
                v = self.decoding
                v[s] = v.item(s) - 1
            else:
                v = self.dispatched_prefill
                v[s] = v.item(s) - d.prefill_tokens
                self._unfresh(d)
            v = self.dispatched_kv
            v[s] = v.item(s) - d.kv_tokens
            v = self.inflight
            v[s] = v.item(s) - 1
            self._refresh(s, blocks=False)
        if router_id is None:
            self._share(request_id, d.instance_id, "finish", now)

    def _unfresh(self, d: _Dispatched) -> None:
        if d.fresh:  # as ``v[slot] -= x``, without a numpy scalar each (as ``on_route``)
            d.fresh = False
            s, v = d.slot, self.fresh_prefill
            v[s] = v.item(s) - d.prefill_tokens
            v = self.fresh_count
            v[s] = v.item(s) - 1

    def _share(self, request_id: str, instance_id: str, kind: str, now: float) -> None:
        if not self.share:
            return
        self.outbox.append(
            RouterLoadEvent(
                router_id=self.router_id,
                instance_id=instance_id,
                request_id=request_id,
                kind=kind,
                timestamp=now,
            )
        )

    def apply_remote(self, ev: RouterLoadEvent, slot: int | None, now: float) -> None:
        """Count another router's dispatch, received at ``now``. ``slot`` is None when the
        worker is unknown here."""
        if ev.router_id == self.router_id:
            return
        if ev.kind == "route" and slot is not None:
            self.on_route(
                ev.request_id,
                slot,
                ev.instance_id,
                prefill_tokens=ev.prefill_tokens,
                kv_tokens=ev.kv_tokens,
                now=now,
                router_id=ev.router_id,
            )
        elif ev.kind == "first_token":
            self.on_first_token(ev.request_id, router_id=ev.router_id)
        elif ev.kind == "finish":
            self.on_finish(ev.request_id, router_id=ev.router_id)

    def forget_router(self, router_id: str) -> None:
        """Another router went away: release everything it had counted."""
        for key in [k for k in self._inflight if self._router_of(k) == router_id]:
            self.on_finish(key if isinstance(key, str) else key[1], router_id=router_id)

    def is_inflight(self, request_id: str) -> bool:
        return request_id in self._inflight

    def _key(self, request_id: str, router_id: str) -> str | tuple[str, str]:
        """The ``_inflight`` key of a request dispatched by ``router_id``: this router's by its
        id alone (a string, which the garbage collector does not track: a tuple per request in
        flight made it collect inside the routing decision), another router's with its id."""
        return request_id if router_id == self.router_id else (router_id, request_id)

    def _router_of(self, key: str | tuple[str, str]) -> str:
        return self.router_id if isinstance(key, str) else key[0]

    # ---- reports ----
    def apply_report(self, slot: int, r: LoadReport, now: float) -> None:
        """A worker's report, received at ``now`` (router clock: worker clocks may differ).

        Every worker sends these many times a second (a simulated one once per engine step:
        most of a virtual-time replay's work), so this reads and writes its slot's numbers one
        by one as plain floats (a numpy scalar, an ``any()`` over the fleet or a ``min`` call
        each cost more than the arithmetic) and writes the figures and derives the slot in one
        compiled call where the module builds (the same doubles as the Python branch: the
        derived values depend on none of the speeds written after it)."""
        ts = r.timestamp
        if ts < self.report_time.item(slot):
            return  # reordered: an older view than the one we have
        self.report_time[slot] = ts
        self._retire_fresh(slot, now - r.held_s)  # a held report shows the worker as it was
        self._write_figures(slot, r)
        self._note_speeds(slot, r)
        if r.weights_load_s or self.num_weights_out:  # never, unless some model offloads
            woken = self._woken.pop(slot, None) if self._woken else None
            if woken is not None and r.weights_load_s and ts <= woken[0]:
                self._woken[slot] = woken  # sent again from before the wake (an idle worker's)
            else:
                self.set_weights_wait(slot, r.weights_load_s)

    def set_weights_wait(self, slot: int, wait_s: float) -> None:
        """The seconds ``slot``'s weights need to come back (0: they are in, or on their way
        after a prefetch)."""
        self.num_weights_out += bool(wait_s) - bool(self.weights_wait_s.item(slot))
        self.weights_wait_s[slot] = wait_s

    def wake(self, slot: int) -> None:
        """A prefetch is loading ``slot``'s weights: it is priced as warm from now until a
        report sent after the wake says otherwise (an idle worker sends its last report again
        and again, and the one it had before the wake still says the weights are out)."""
        self._woken[slot] = (self.report_time.item(slot), self.weights_wait_s.item(slot))
        self.set_weights_wait(slot, 0.0)

    def wake_failed(self, slot: int) -> None:
        """The prefetch of ``slot``'s weights failed: they are out still, priced as before."""
        woken = self._woken.pop(slot, None)
        if woken is not None:
            self.set_weights_wait(slot, woken[1])

    def weights_waits(self) -> np.ndarray | None:
        """``weights_wait_s`` where some worker's weights are out, else None."""
        return self.weights_wait_s if self.num_weights_out else None

    def _retire_fresh(self, slot: int, now: float) -> None:
        """The slot's dispatches routed before ``now - report_lag_s`` are in its report (made
        at ``now``, router clock): no longer counted on top of it."""
        fresh = self._fresh.get(slot)
        if fresh is None:
            fresh = self._fresh[slot] = []
        if fresh:
            covered_before = now - self.report_lag_s
            i = 0
            for key in fresh:
                d = self._inflight.get(key)
                if d is not None and d.routed_at >= covered_before:
                    break
                if d is not None:
                    self._unfresh(d)
                i += 1
            del fresh[:i]

    def _write_figures(self, slot: int, r: LoadReport) -> None:
        """The report's queue and KV figures, and the slot's derived values."""
        waiting = r.num_waiting
        total = r.kv_blocks_total
        frac = r.kv_blocks_used / total if total else None
        compiled = self._report
        if compiled is not None:  # the figures and ``_refresh`` in one compiled call
            figures = (r.queued_prefill_tokens, r.num_running + waiting, waiting, frac)
            self._num_busy += compiled(self._account_vectors, slot, figures, self._limits)
        else:
            self.reported_prefill[slot] = r.queued_prefill_tokens
            self.reported_running[slot] = r.num_running + waiting
            self.reported_waiting[slot] = waiting
            if frac is not None:
                self.kv_used_frac[slot] = frac
            self._refresh(slot)

    def _note_speeds(self, slot: int, r: LoadReport) -> None:
        """The report's measured speeds: prefill throughput, the step-time line, lower-tier
        load time per block, the decode step."""
        if r.prefill_tokens_per_s > 0:
            self.prefill_tps[slot] = r.prefill_tokens_per_s
            if not self._num_fitted:
                self._speeds = None  # 1 / tps prices the workers until one has a line
        step_s = r.step_time_s
        if step_s > 0 and r.tokens_computed > r.num_running:
            # A step that computed prompt tokens (a decode-only step computes one per running
            # request and has no prefill overhead, so it would bend the line). Known to let
            # through the decode steps in which a request finished (fewer running after them):
            # on a workload of one prompt length, half the points, and the line came out at
            # 50-80 us a token where the mock prefill costs 15. Fitted to prefill steps alone
            # (a report field with the step's prompt tokens), the line was right but the cost's
            # weights, measured against this one, routed worse (TTFT p99 higher at 11 of 13
            # rows; 2026-12-08): kept until the weights are measured again with a true line.
            fit = self._fits.get(slot)
            if fit is None:
                fit = self._fits[slot] = StepTimeFit()
            fit.add(r.tokens_computed, step_s)
            est = fit.estimate()
            if est is not None:
                self._set_fit(slot, est)
        tiers = r.kv_tiers
        if tiers:
            loads = sum(t.loads for t in tiers)
            if loads:
                self.load_s_per_block[slot] = sum(t.load_s for t in tiers) / loads
        decode_s = r.decode_step_s
        if decode_s > 0:
            self._note_decode_step(slot, decode_s)
            if self.inv_kv_tokens.item(slot):
                # ``context_usage(slot)``: kept in ``_context`` by every change of its inputs
                self._decode_fit.add(self._context.item(slot), decode_s)
                self._decode_line_stale = True

    def _note_decode_step(self, slot: int, step_s: float) -> None:
        """Record a measured decode step, keeping the fastest one any worker reported."""
        fastest = self._fastest_decode
        measured = self.decode_measured
        if fastest is not None:
            if not self._num_measured or step_s < fastest:
                fastest = step_s
            elif measured.item(slot) and self.decode_step_s.item(slot) == fastest and step_s > fastest:
                fastest = None  # the fastest one got slower: look again when needed
        self._fastest_decode = fastest
        self.decode_step_s[slot] = step_s
        if not measured.item(slot):
            measured[slot] = True
            self._num_measured += 1

    def _set_fit(self, slot: int, est: tuple[float, float]) -> None:
        if not self._fitted.item(slot):
            self._fitted[slot] = True
            self._num_fitted += 1
            self._speeds = None
        self._fit_a[slot], self._fit_b[slot] = est
        if self._num_fitted < len(self._fits):
            self._speeds = None  # the fleet's median prices the workers without a line

    # ---- merged view (vectors over slots; read them, never write them) ----
    def speeds(self) -> tuple[np.ndarray, np.ndarray]:
        """``(step_overhead_s, per_token_s)`` per slot: the worker's own fitted line, else the
        fleet's median line, else its reported tokens/s with the default overhead. Once every
        worker has its line these are the lines themselves, updated in place by reports."""
        if self._speeds is None:
            fitted = self._fitted
            if not self._num_fitted:
                self._speeds = (np.full(len(fitted), DEFAULT_STEP_OVERHEAD_S), 1.0 / self.prefill_tps)
            elif self._num_fitted == len(self._fits):
                self._speeds = (self._fit_a, self._fit_b)
            else:
                overhead = np.full(len(fitted), np.median(self._fit_a[fitted]))
                per_token = np.full(len(fitted), np.median(self._fit_b[fitted]))
                overhead[fitted] = self._fit_a[fitted]
                per_token[fitted] = self._fit_b[fitted]
                self._speeds = (overhead, per_token)
        return self._speeds

    def queued_prefill(self) -> np.ndarray:
        """Prompt tokens ahead of a new request: the last report plus what was sent since."""
        return self._queued

    def queue_depth(self) -> np.ndarray:
        """Requests waiting at each worker: the last report's queue plus what was sent since
        (an upper bound: some of those may have started running already)."""
        return self._depth

    def decode_step(self) -> np.ndarray:
        """Expected decode step seconds per slot. Decode time grows with the context a worker's
        requests read, and a worker's own decode-step average is noisy and stale (it only moves
        on decode-only steps), so once the fleet's reports span a range of context, the
        estimate is the fleet's line (step time against summed context over KV tokens) at each
        worker's current context, dispatches included; until then ``_decode_step_measured``.
        The vector is a buffer the next call overwrites."""
        vector, mul, add = self.decode_step_terms()
        step = self._step
        if len(step) != len(vector):
            step = self._step = np.empty(len(vector))
        np.multiply(vector, mul, out=step)
        if add is not None:
            step += add
        return step

    def decode_step_terms(self) -> tuple[np.ndarray, float, float | None]:
        """``decode_step()`` as ``vector * mul + add`` (no ``add``: None), left to compute: the
        fleet's line, ``capped context * slope + base``; until it exists, ``prior * fastest``
        (``_decode_step_measured``). The compiled decision computes it as it reads it.
        A line once fitted is kept while the fleet's recent reports span too little context to
        fit another (a saturated fleet's are all at ``MAX_DECODE_CONTEXT``): the prior would
        take the fastest step then reported, a loaded worker's, for an empty one's and price
        steps at 5x it (120 ms where the engine's longest is 34 ms on the agent workload, which
        sent long sessions away from their caches)."""
        if self._decode_line_stale:
            line = self._decode_fit.estimate(min_spread_tokens=0.01)
            if line is not None:
                self._decode_line = line
            self._decode_line_stale = False
        if self._decode_line is None:
            return self._prior, self._decode_step_measured(), None
        base, slope = self._decode_line
        return self._context, slope, base

    def context_usage(self, slot: int) -> float:
        """Summed context of the worker's requests over its KV tokens: what a decode step
        reads (a shared prefix counts once per request, unlike blocks in use), at most
        ``MAX_DECODE_CONTEXT``."""
        return min(float(self.dispatched_kv[slot] * self.inv_kv_tokens[slot]), MAX_DECODE_CONTEXT)

    def _decode_step_measured(self) -> float:
        """Until the fleet's line exists, the step is this times each worker's prior growth
        (``_prior``): the fastest decode step any worker reported (the
        step of a worker holding little KV), grown with each worker's summed context by a
        prior slope (``DECODE_CONTEXT_SLOPE``). A worker's own average is no measure of its
        load (it only moves on decode-only steps, rare on a busy worker), and a fixed default
        for workers that never decoded priced every cold worker above the first one to report
        (a cold burst all went to it)."""
        if self._fastest_decode is None:
            measured = self.decode_measured
            self._fastest_decode = (
                float(self.decode_step_s[measured].min()) if measured.any() else DEFAULT_DECODE_STEP_S
            )
        return self._fastest_decode

    def stalled(self, over: str) -> np.ndarray:
        """Per slot: the requests a prefill step there stalls, as ``CostParams.stall_over``
        counts them: "decoding" (past their first token), else every request in flight."""
        return self.decoding if over == "decoding" else self._busy_n

    def cost_vectors(self, price_room: bool, stall_over: str = "decoding") -> tuple[object, ...]:
        """What the compiled ``kv`` decision reads, in its order (``csrc/kvindex.c``,
        ``decide``): queue ahead, per-token and per-step speed, reported queue depth, decode
        step (as ``decode_step_terms``, computed there), KV usage as reported, blocks free and in
        use (None, None without ``price_room``), in-flight requests, the requests a prefill
        stalls (``stalled``). One call instead of seven on the decision's path."""
        overhead, per_token = self.speeds()
        room = price_room
        return (
            self._queued,
            per_token,
            overhead,
            self.reported_waiting,
            self.decode_step_terms(),
            self.kv_used_frac,
            self._free if room else None,
            self._used if room else None,
            self._busy_n,
            self.stalled(stall_over),
        )

    def blocks_in_use(self) -> tuple[np.ndarray, np.ndarray]:
        """``(in use, free)`` blocks per slot as last reported (free is +inf where the size is
        unknown)."""
        return self._used, self._free

    def kv_usage(self) -> np.ndarray:
        """Fraction of KV in use: reported, or dispatched footprint if that is larger."""
        return self._usage

    def busy(self) -> np.ndarray:
        """In-flight requests per slot: dispatched, or reported if larger."""
        return self._busy_n

    def busy_mask(self) -> np.ndarray:
        """Per slot: the worker is busy (see the class docstring)."""
        return self._busy

    @property
    def num_busy(self) -> int:
        return self._num_busy

    # ---- checks ----
    def check_derived(self) -> None:
        """The vectors kept slot by slot equal their definitions computed from scratch."""
        eq = np.testing.assert_array_equal
        eq(self._queued, self.reported_prefill + self.fresh_prefill)
        eq(self._depth, self.reported_waiting + self.fresh_count)
        eq(self._busy_n, np.maximum(self.inflight, self.reported_running))
        eq(self._usage, np.maximum(self.kv_used_frac, self.dispatched_kv * self.inv_kv_tokens))
        context = np.minimum(self.dispatched_kv * self.inv_kv_tokens, MAX_DECODE_CONTEXT)
        eq(self._context, context)
        eq(self._prior, 1.0 + DECODE_CONTEXT_SLOPE * context)
        total = self.kv_tokens_total / self._block_size
        used = self.kv_used_frac * total
        eq(self._used, used)
        eq(self._free, np.where(total > 0, total - used, np.inf))
        busy = self.kv_used_frac >= self.busy_kv_usage
        busy |= self._usage >= self.busy_kv_footprint
        if self.max_inflight:
            busy |= self._busy_n >= self.max_inflight
        busy |= self._depth > self._queue_limit
        eq(self._busy, busy)
        assert self._num_busy == int(busy.sum())
        assert self._num_fitted == int(self._fitted.sum())
        assert self._num_measured == int(self.decode_measured.sum())
        measured = self.decode_measured
        if self._fastest_decode is not None and measured.any():
            assert self._fastest_decode == self.decode_step_s[measured].min()
        assert set(self._fits) >= set(np.flatnonzero(self._fitted).tolist())
