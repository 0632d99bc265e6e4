"""The router service as the planner's ``LoadView`` (read-only use of its public view: last load
report per worker, its routers' queues, the requests waiting for a worker, and counters), plus the routing-weight ramp applied to
every router that knows a worker.

Traffic totals come from the routers' request counters (requests, prompt tokens, predicted
cached tokens where each prompt is computed: once per request, not per decision, so a
disaggregated request's two legs, retries and migrated legs do not count as arrivals); finished requests (their TTFT, decode time and output length) from the
dispatcher's completions, which the view reads past its own count (``DispatchMetrics.recent``
keeps the last few thousand: a planner that looks less often than that many finish sees the
newest ones).
"""

from __future__ import annotations

from collections.abc import Sequence

from interlock.planner.loop import TrafficTotals
from interlock.protocol.events import LoadReport
from interlock.protocol.routing import Completion
from interlock.router.model_router import Router
from interlock.router.service import RouterService


class RouterServiceView:
    """``model``: see only that model's router and requests (its queue, its traffic, its
    finished requests, its workers' weights: a planner that scales one model's workers,
    ``Cluster.create_serving_instance``); None: every model's."""

    def __init__(self, service: RouterService, *, model: str | None = None) -> None:
        self.service = service
        self.model = model
        self._completed = service.dispatcher.metrics.completed

    def _routers(self) -> list[Router]:
        routers = self.service.routers
        if self.model is None:
            return list(routers.values())
        router = routers.get(self.model)
        return [] if router is None else [router]

    async def refresh(self) -> None:
        pass  # read live

    def report(self, instance_id: str) -> LoadReport | None:
        return self.service.report(instance_id)

    def queued(self) -> int:
        """Requests waiting in the routers' queues for a free worker, and those waiting for a
        worker at a model that has none (scaled to zero): the planner's ``router_queue``, which
        wakes an empty pool (``Planner._wake``)."""
        return sum(len(r.queue) for r in self._routers()) + self.service.waiting_for_worker(self.model)

    def totals(self) -> TrafficTotals:
        ms = [r.metrics for r in self._routers()]
        return TrafficTotals(
            requests=sum(m.requests for m in ms),
            prompt_tokens=sum(m.request_prompt_tokens for m in ms),
            cached_tokens=sum(m.request_cached_tokens for m in ms),
        )

    def completions(self) -> Sequence[Completion]:
        self._completed, out = self.completions_since(self._completed)
        return out

    def completions_since(self, seen: int) -> tuple[int, list[Completion]]:
        """The dispatcher's count of finished requests, and those past the first ``seen`` of
        them (the reader keeps its own count: several may read; a count from before a restart,
        above the current one, reads what is kept)."""
        m = self.service.dispatcher.metrics
        new = m.completed - seen if seen <= m.completed else m.completed
        out = list(m.recent)[len(m.recent) - min(new, len(m.recent)) :]
        return m.completed, out if self.model is None else [c for c in out if c.model == self.model]

    def set_weight(self, instance_id: str, weight: float) -> None:
        for r in self._routers():
            r.set_weight(instance_id, weight)
