"""Per-worker load as the router sees it: its own dispatches merged with workers' reports.

Why dispatch-time accounting: load reports arrive every few tens of milliseconds, and a burst
of requests arriving in between would all see the same idle worker and herd onto it. So the
router counts what it sends, at once: on route the request's uncached prompt tokens join the
worker's prefill queue and its KV tokens join the worker's footprint; at the first token the
prefill part is done; at the end everything is released. Other routers (several frontends side
by side) share the same three moments as ``RouterLoadEvent`` messages; they are counted the
same way under their router id.

Merging with a ``LoadReport``: the report is the truth about what the worker has received, the
dispatch count is the truth about what is on its way; the merged queue is the larger of the two
(each one can only miss work, never invent it). Speeds (prefill tokens/s, decode step time)
come only from reports, with defaults until the first one.

State is kept in numpy vectors indexed by the indexer's worker slot so the cost function runs
vectorised over all workers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from interlock.protocol.events import LoadReport, RouterLoadEvent

DEFAULT_PREFILL_TPS = 10_000.0
"""Assumed prefill speed (tokens/s) before a worker's first report. Only ratios between workers
matter to the decision, so a shared default is harmless."""
DEFAULT_DECODE_STEP_S = 0.02


@dataclass(slots=True)
class _Dispatched:
    slot: int
    instance_id: str
    prefill_tokens: int
    kv_tokens: int
    prefill_done: bool = False


class LoadTracker:
    """Dispatch-time load plus the latest report, per worker slot."""

    def __init__(self, router_id: str = "local", capacity: int = 64) -> None:
        self.router_id = router_id
        self._inflight: dict[tuple[str, str], _Dispatched] = {}
        n = capacity
        self.dispatched_prefill = np.zeros(n)
        """Uncached prompt tokens dispatched and not yet past their first token."""
        self.dispatched_kv = np.zeros(n)
        """KV tokens (prompt + expected output) of dispatched, unfinished requests."""
        self.inflight = np.zeros(n)
        self.decoding = np.zeros(n)
        self.reported_prefill = np.zeros(n)
        self.reported_running = np.zeros(n)
        self.kv_used_frac = np.zeros(n)
        self.kv_tokens_total = np.zeros(n)
        self.prefill_tps = np.full(n, DEFAULT_PREFILL_TPS)
        self.decode_step_s = np.full(n, DEFAULT_DECODE_STEP_S)
        self.report_time = np.full(n, -np.inf)
        self.outbox: list[RouterLoadEvent] = []
        """Events for other routers; the glue drains and publishes them."""

    # ---- membership ----
    def add_worker(self, slot: int, *, kv_blocks_total: int = 0, block_size: int = 16) -> None:
        self._grow(slot + 1)
        for arr in (self.dispatched_prefill, self.dispatched_kv, self.inflight, self.decoding,
                    self.reported_prefill, self.reported_running, self.kv_used_frac):
            arr[slot] = 0.0
        self.kv_tokens_total[slot] = kv_blocks_total * block_size
        self.prefill_tps[slot] = DEFAULT_PREFILL_TPS
        self.decode_step_s[slot] = DEFAULT_DECODE_STEP_S
        self.report_time[slot] = -np.inf

    def remove_worker(self, slot: int) -> None:
        for key in [k for k, d in self._inflight.items() if d.slot == slot]:
            del self._inflight[key]
        self.add_worker(slot)

    def _grow(self, n: int) -> None:
        size = len(self.inflight)
        if n <= size:
            return
        new = max(n, 2 * size)
        for name in ("dispatched_prefill", "dispatched_kv", "inflight", "decoding",
                     "reported_prefill", "reported_running", "kv_used_frac", "kv_tokens_total"):
            arr = getattr(self, name)
            setattr(self, name, np.concatenate([arr, np.zeros(new - size)]))
        self.prefill_tps = np.concatenate([self.prefill_tps, np.full(new - size, DEFAULT_PREFILL_TPS)])
        self.decode_step_s = np.concatenate(
            [self.decode_step_s, np.full(new - size, DEFAULT_DECODE_STEP_S)]
        )
        self.report_time = np.concatenate([self.report_time, np.full(new - size, -np.inf)])

    # ---- dispatch accounting (this router, or another one via apply_remote) ----
    def on_route(self, request_id: str, slot: int, instance_id: str, *, prefill_tokens: int,
                 kv_tokens: int, now: float, router_id: str | None = None) -> None:
        rid = router_id or self.router_id
        if (rid, request_id) in self._inflight:
            return
        self._inflight[(rid, request_id)] = _Dispatched(slot, instance_id, prefill_tokens, kv_tokens)
        self.dispatched_prefill[slot] += prefill_tokens
        self.dispatched_kv[slot] += kv_tokens
        self.inflight[slot] += 1
        if router_id is None:
            self.outbox.append(RouterLoadEvent(
                router_id=rid, instance_id=instance_id, request_id=request_id, kind="route",
                timestamp=now, prefill_tokens=prefill_tokens, kv_tokens=kv_tokens))

    def on_first_token(self, request_id: str, *, now: float = 0.0,
                       router_id: str | None = None) -> None:
        d = self._inflight.get((router_id or self.router_id, request_id))
        if d is None or d.prefill_done:
            return
        d.prefill_done = True
        self.dispatched_prefill[d.slot] -= d.prefill_tokens
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
        self.dispatched_kv[d.slot] -= d.kv_tokens
        self.inflight[d.slot] -= 1
        if router_id is None:
            self._share(request_id, d.instance_id, "finish", now)

    def _share(self, request_id: str, instance_id: str, kind: str, now: float) -> None:
        self.outbox.append(RouterLoadEvent(router_id=self.router_id, instance_id=instance_id,
                                           request_id=request_id, kind=kind, timestamp=now))

    def apply_remote(self, ev: RouterLoadEvent, slot: int | None) -> None:
        """Count another router's dispatch. ``slot`` is None when the worker is unknown here."""
        if ev.router_id == self.router_id:
            return
        if ev.kind == "route" and slot is not None:
            self.on_route(ev.request_id, slot, ev.instance_id, prefill_tokens=ev.prefill_tokens,
                          kv_tokens=ev.kv_tokens, now=ev.timestamp, router_id=ev.router_id)
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
    def apply_report(self, slot: int, r: LoadReport) -> None:
        if r.timestamp < self.report_time[slot]:
            return  # reordered: an older view than the one we have
        self.report_time[slot] = r.timestamp
        self.reported_prefill[slot] = r.queued_prefill_tokens
        self.reported_running[slot] = r.num_running + r.num_waiting
        if r.kv_blocks_total:
            self.kv_used_frac[slot] = r.kv_blocks_used / r.kv_blocks_total
        if r.prefill_tokens_per_s > 0:
            self.prefill_tps[slot] = r.prefill_tokens_per_s
        if r.decode_step_s > 0:
            self.decode_step_s[slot] = r.decode_step_s

    # ---- merged view ----
    def queued_prefill(self) -> np.ndarray:
        return np.maximum(self.dispatched_prefill, self.reported_prefill)

    def kv_usage(self) -> np.ndarray:
        """Fraction of KV in use: reported, or dispatched footprint if that is larger."""
        with np.errstate(divide="ignore", invalid="ignore"):
            disp = np.where(self.kv_tokens_total > 0, self.dispatched_kv / self.kv_tokens_total, 0.0)
        return np.maximum(self.kv_used_frac, disp)

    def busy(self) -> np.ndarray:
        """In-flight requests per slot: dispatched, or reported if larger."""
        return np.maximum(self.inflight, self.reported_running)
