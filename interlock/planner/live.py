"""The router service as the planner's ``LoadView`` (read-only use of its public view: last load
report per worker, its routers' queues and counters), plus the routing-weight ramp applied to
every router that knows a worker.

Traffic totals come from the routers' decision counters (requests, prompt tokens, predicted
cached tokens); finished requests (their TTFT, decode time and output length) from the
dispatcher's completions, which the view reads past its own count (``DispatchMetrics.recent``
keeps the last few thousand: a planner that looks less often than that many finish sees the
newest ones).
"""

from __future__ import annotations

from collections.abc import Sequence

from interlock.planner.loop import TrafficTotals
from interlock.protocol.events import LoadReport
from interlock.router.dispatcher import Completion
from interlock.router.service import RouterService


class RouterServiceView:
    def __init__(self, service: RouterService) -> None:
        self.service = service
        self._completed = service.dispatcher.metrics.completed

    def report(self, instance_id: str) -> LoadReport | None:
        return self.service.report(instance_id)

    def queued(self) -> int:
        return sum(len(r.queue) for r in self.service.routers.values())

    def totals(self) -> TrafficTotals:
        ms = [r.metrics for r in self.service.routers.values()]
        return TrafficTotals(
            requests=sum(m.decisions for m in ms),
            prompt_tokens=sum(m.prompt_tokens for m in ms),
            cached_tokens=sum(m.predicted_cached_tokens for m in ms),
        )

    def completions(self) -> Sequence[Completion]:
        m = self.service.dispatcher.metrics
        new, self._completed = m.completed - self._completed, m.completed
        return list(m.recent)[len(m.recent) - min(new, len(m.recent)) :]

    def set_weight(self, instance_id: str, weight: float) -> None:
        for r in self.service.routers.values():
            r.set_weight(instance_id, weight)
