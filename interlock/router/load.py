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
vectorised over all workers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from interlock.protocol.events import LoadReport, RouterLoadEvent
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


@dataclass(slots=True)
class _Dispatched:
    slot: int
    instance_id: str
    prefill_tokens: int
    kv_tokens: int
    routed_at: float
    prefill_done: bool = False
    fresh: bool = True
    """Not yet covered by a load report from its worker."""


class LoadTracker:
    """Dispatch-time load plus the latest report, per worker slot."""

    def __init__(
        self, router_id: str = "local", capacity: int = 64, report_lag_s: float = 0.0, share: bool = True
    ) -> None:
        self.router_id = router_id
        self.share = share
        """Record this router's dispatches in ``outbox`` for other routers (off: nothing kept)."""
        self.report_lag_s = report_lag_s
        """A report received at t covers requests routed before t - report_lag_s."""
        self._fresh: dict[int, list[tuple[str, str]]] = {}
        self._inflight: dict[tuple[str, str], _Dispatched] = {}
        n = capacity
        self.dispatched_prefill = np.zeros(n)
        """Uncached prompt tokens dispatched and not yet past their first token."""
        self.dispatched_kv = np.zeros(n)
        """KV tokens (prompt + expected output) of dispatched, unfinished requests."""
        self.inflight = np.zeros(n)
        self.decoding = np.zeros(n)
        self.reported_prefill = np.zeros(n)
        self.fresh_prefill = np.zeros(n)
        """Prefill dispatched since the worker's last report (not in reported_prefill yet)."""
        self.fresh_count = np.zeros(n)
        """Requests dispatched since the worker's last report (the ones behind fresh_prefill)."""
        self.reported_waiting = np.zeros(n)
        self.reported_running = np.zeros(n)
        self.kv_used_frac = np.zeros(n)
        self.kv_tokens_total = np.zeros(n)
        self.inv_kv_tokens = np.zeros(n)
        """1 / kv_tokens_total (0 when unknown), so usage is one multiply per decision."""
        self.prefill_tps = np.full(n, DEFAULT_PREFILL_TPS)
        self.decode_step_s = np.full(n, DEFAULT_DECODE_STEP_S)
        self.load_s_per_block = np.full(n, DEFAULT_LOAD_S_PER_BLOCK)
        """Measured seconds to load one KV block from the worker's lower tiers (host, disk)."""
        self.decode_measured = np.zeros(n, dtype=bool)
        """The worker has reported a decode step time (until then it is priced like the fleet)."""
        self.report_time = np.full(n, -np.inf)
        self._fits: dict[int, StepTimeFit] = {}
        self._fitted: dict[int, tuple[float, float]] = {}
        self._speeds: tuple[np.ndarray, np.ndarray] | None = None
        self._blocks: tuple[np.ndarray, np.ndarray] | None = None
        self._decode_fit = StepTimeFit(decay=0.99)
        """Fleet-wide line: decode step seconds against KV usage (0..1)."""
        self.outbox: list[RouterLoadEvent] = []
        """Events for other routers; the glue drains and publishes them."""

    # ---- membership ----
    def add_worker(self, slot: int, *, kv_blocks_total: int = 0, block_size: int = 16) -> None:
        self._grow(slot + 1)
        self._fresh[slot] = []
        for arr in (
            self.dispatched_prefill,
            self.dispatched_kv,
            self.inflight,
            self.decoding,
            self.reported_prefill,
            self.reported_running,
            self.kv_used_frac,
            self.fresh_prefill,
            self.fresh_count,
            self.reported_waiting,
        ):
            arr[slot] = 0.0
        self.kv_tokens_total[slot] = kv_blocks_total * block_size
        self.inv_kv_tokens[slot] = 1.0 / (kv_blocks_total * block_size) if kv_blocks_total else 0.0
        self.prefill_tps[slot] = DEFAULT_PREFILL_TPS
        self.decode_step_s[slot] = DEFAULT_DECODE_STEP_S
        self.load_s_per_block[slot] = DEFAULT_LOAD_S_PER_BLOCK
        self.decode_measured[slot] = False
        self.report_time[slot] = -np.inf
        self._fits[slot] = StepTimeFit()
        self._fitted.pop(slot, None)
        self._speeds = None
        self._blocks = None

    def remove_worker(self, slot: int) -> None:
        for key in [k for k, d in self._inflight.items() if d.slot == slot]:
            del self._inflight[key]
        self.add_worker(slot)

    def _grow(self, n: int) -> None:
        size = len(self.inflight)
        if n <= size:
            return
        new = max(n, 2 * size)
        for name in (
            "dispatched_prefill",
            "dispatched_kv",
            "inflight",
            "decoding",
            "reported_prefill",
            "reported_running",
            "kv_used_frac",
            "kv_tokens_total",
            "inv_kv_tokens",
            "fresh_prefill",
            "fresh_count",
            "reported_waiting",
        ):
            arr = getattr(self, name)
            setattr(self, name, np.concatenate([arr, np.zeros(new - size)]))
        self.prefill_tps = np.concatenate([self.prefill_tps, np.full(new - size, DEFAULT_PREFILL_TPS)])
        self.decode_step_s = np.concatenate([self.decode_step_s, np.full(new - size, DEFAULT_DECODE_STEP_S)])
        self.load_s_per_block = np.concatenate(
            [self.load_s_per_block, np.full(new - size, DEFAULT_LOAD_S_PER_BLOCK)]
        )
        self.report_time = np.concatenate([self.report_time, np.full(new - size, -np.inf)])
        self.decode_measured = np.concatenate([self.decode_measured, np.zeros(new - size, dtype=bool)])

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
        rid = router_id or self.router_id
        if (rid, request_id) in self._inflight:
            return
        self._inflight[(rid, request_id)] = _Dispatched(slot, instance_id, prefill_tokens, kv_tokens, now)
        self._fresh.setdefault(slot, []).append((rid, request_id))
        self.dispatched_prefill[slot] += prefill_tokens
        self.fresh_prefill[slot] += prefill_tokens
        self.fresh_count[slot] += 1
        self.dispatched_kv[slot] += kv_tokens
        self.inflight[slot] += 1
        if router_id is None and self.share:
            self.outbox.append(
                RouterLoadEvent(
                    router_id=rid,
                    instance_id=instance_id,
                    request_id=request_id,
                    kind="route",
                    timestamp=now,
                    prefill_tokens=prefill_tokens,
                    kv_tokens=kv_tokens,
                )
            )

    def on_first_token(self, request_id: str, *, now: float = 0.0, router_id: str | None = None) -> None:
        d = self._inflight.get((router_id or self.router_id, request_id))
        if d is None or d.prefill_done:
            return
        d.prefill_done = True
        self.dispatched_prefill[d.slot] -= d.prefill_tokens
        self._unfresh(d)
        self.decoding[d.slot] += 1
        if router_id is None:
            self._share(request_id, d.instance_id, "first_token", now)

    def on_finish(self, request_id: str, *, now: float = 0.0, router_id: str | None = None) -> None:
        d = self._inflight.pop((router_id or self.router_id, request_id), None)
        if d is None:
            return
        if d.prefill_done:
            self.decoding[d.slot] -= 1
        else:
            self.dispatched_prefill[d.slot] -= d.prefill_tokens
            self._unfresh(d)
        self.dispatched_kv[d.slot] -= d.kv_tokens
        self.inflight[d.slot] -= 1
        if router_id is None:
            self._share(request_id, d.instance_id, "finish", now)

    def _unfresh(self, d: _Dispatched) -> None:
        if d.fresh:
            d.fresh = False
            self.fresh_prefill[d.slot] -= d.prefill_tokens
            self.fresh_count[d.slot] -= 1

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
        for rid, req in [k for k in self._inflight if k[0] == router_id]:
            self.on_finish(req, router_id=rid)

    def is_inflight(self, request_id: str) -> bool:
        return (self.router_id, request_id) in self._inflight

    # ---- reports ----
    def apply_report(self, slot: int, r: LoadReport, now: float) -> None:
        """A worker's report, received at ``now`` (router clock: worker clocks may differ)."""
        if r.timestamp < self.report_time[slot]:
            return  # reordered: an older view than the one we have
        self.report_time[slot] = r.timestamp
        self.reported_prefill[slot] = r.queued_prefill_tokens
        covered_before = now - self.report_lag_s
        fresh = self._fresh.setdefault(slot, [])
        i = 0
        for key in fresh:
            d = self._inflight.get(key)
            if d is not None and d.routed_at >= covered_before:
                break
            if d is not None:
                self._unfresh(d)
            i += 1
        del fresh[:i]
        self.reported_running[slot] = r.num_running + r.num_waiting
        self.reported_waiting[slot] = r.num_waiting
        if r.kv_blocks_total:
            self.kv_used_frac[slot] = r.kv_blocks_used / r.kv_blocks_total
            self._blocks = None
        if r.prefill_tokens_per_s > 0:
            self.prefill_tps[slot] = r.prefill_tokens_per_s
            self._speeds = None
        if r.step_time_s > 0 and r.tokens_computed > r.num_running:
            # A step that computed prompt tokens (a decode-only step computes one per running
            # request and has no prefill overhead, so it would bend the line).
            fit = self._fits.setdefault(slot, StepTimeFit())
            fit.add(r.tokens_computed, r.step_time_s)
            est = fit.estimate()
            if est is not None:
                self._fitted[slot] = est
                self._speeds = None
        loads = sum(t.loads for t in r.kv_tiers)
        if loads:
            self.load_s_per_block[slot] = sum(t.load_s for t in r.kv_tiers) / loads
        if r.decode_step_s > 0:
            self.decode_step_s[slot] = r.decode_step_s
            self.decode_measured[slot] = True
            if self.inv_kv_tokens[slot]:
                self._decode_fit.add(self.context_usage(slot), r.decode_step_s)

    # ---- merged view ----
    def speeds(self) -> tuple[np.ndarray, np.ndarray]:
        """``(step_overhead_s, per_token_s)`` per slot: the worker's own fitted line, else the
        fleet's median line, else its reported tokens/s with the default overhead."""
        if self._speeds is None:
            overhead = np.full(len(self.inflight), DEFAULT_STEP_OVERHEAD_S)
            per_token = 1.0 / self.prefill_tps
            if self._fitted:
                fits = np.asarray(list(self._fitted.values()))
                overhead[:] = np.median(fits[:, 0])
                if len(self._fitted) < len(self._fits):
                    per_token = np.full(len(self.inflight), np.median(fits[:, 1]))
                for slot, (a, b) in self._fitted.items():
                    overhead[slot], per_token[slot] = a, b
            self._speeds = (overhead, per_token)
        return self._speeds

    def queued_prefill(self) -> np.ndarray:
        """Prompt tokens ahead of a new request: the last report plus what was sent since."""
        return self.reported_prefill + self.fresh_prefill

    def queue_depth(self) -> np.ndarray:
        """Requests waiting at each worker: the last report's queue plus what was sent since
        (an upper bound: some of those may have started running already)."""
        return self.reported_waiting + self.fresh_count

    def decode_step(self) -> np.ndarray:
        """Expected decode step seconds per slot. Decode time grows with the context a worker's
        requests read, and a worker's own decode-step average is noisy and stale (it only moves
        on decode-only steps), so once the fleet's reports span a range of context, the
        estimate is the fleet's line (step time against summed context over KV tokens) at each
        worker's current context, dispatches included; until then ``_decode_step_measured``."""
        fit = self._decode_fit.estimate(min_spread_tokens=0.01)
        if fit is None:
            return self._decode_step_measured()
        base, slope = fit
        return base + slope * self.decode_context()

    def context_usage(self, slot: int) -> float:
        """Summed context of the worker's requests over its KV tokens: what a decode step
        reads (a shared prefix counts once per request, unlike blocks in use), at most
        ``MAX_DECODE_CONTEXT``."""
        return min(float(self.dispatched_kv[slot] * self.inv_kv_tokens[slot]), MAX_DECODE_CONTEXT)

    def decode_context(self) -> np.ndarray:
        """``context_usage`` of every slot."""
        return np.minimum(self.dispatched_kv * self.inv_kv_tokens, MAX_DECODE_CONTEXT)

    def _decode_step_measured(self) -> np.ndarray:
        """Until the fleet's line exists: the fastest decode step any worker reported (the
        step of a worker holding little KV), grown with each worker's summed context by a
        prior slope (``DECODE_CONTEXT_SLOPE``). A worker's own average is no measure of its
        load (it only moves on decode-only steps, rare on a busy worker), and a fixed default
        for workers that never decoded priced every cold worker above the first one to report
        (a cold burst all went to it)."""
        measured = self.decode_measured
        base = float(self.decode_step_s[measured].min()) if measured.any() else DEFAULT_DECODE_STEP_S
        return base * (1.0 + DECODE_CONTEXT_SLOPE * self.decode_context())

    def blocks_in_use(self, block_size: int) -> tuple[np.ndarray, np.ndarray]:
        """``(in use, free)`` blocks per slot as last reported (free is +inf where the size is
        unknown); kept until the next report."""
        if self._blocks is None:
            total = self.kv_tokens_total / block_size
            used = self.kv_used_frac * total
            self._blocks = (used, np.where(total > 0, total - used, np.inf))
        return self._blocks

    def kv_usage(self) -> np.ndarray:
        """Fraction of KV in use: reported, or dispatched footprint if that is larger."""
        return np.maximum(self.kv_used_frac, self.dispatched_kv * self.inv_kv_tokens)

    def busy(self) -> np.ndarray:
        """In-flight requests per slot: dispatched, or reported if larger."""
        return np.maximum(self.inflight, self.reported_running)
