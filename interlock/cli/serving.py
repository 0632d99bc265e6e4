"""What ``serve`` and ``frontend`` share: the router service behind the HTTP frontend."""

from __future__ import annotations

from collections.abc import AsyncIterator

from interlock.deploy import Routing
from interlock.frontend.backend import ModelEntry, RequestContext
from interlock.protocol import GenerateOutput, GenerateRequest
from interlock.router.facade import RouterConfig
from interlock.router.service import RouterService


class ServiceBackend:
    """Adapts ``RouterService`` to the frontend's ``Backend`` protocol."""

    def __init__(self, service: RouterService) -> None:
        self.service = service

    def models(self) -> list[ModelEntry]:
        return [ModelEntry(m.name, m.model_path, m.context_length) for m in self.service.models()]

    def generate(self, request: GenerateRequest, ctx: RequestContext) -> AsyncIterator[GenerateOutput]:
        return self.service.generate(request, ctx)

    def prometheus_text(self) -> str:
        return self.service.prometheus_text()


def router_config(
    routing: Routing, *, max_inflight_per_worker: int = 0, chunk_tokens: int = 2048
) -> RouterConfig:
    """``chunk_tokens``: the workers' max_num_batched_tokens (prefill tokens per step)."""
    from interlock.router.cost import CostParams

    return RouterConfig(
        policy=routing.policy,
        cost=CostParams(kv_watermark=routing.kv_usage_watermark, chunk_tokens=chunk_tokens),
        queue_capacity=routing.queue_size,
        max_inflight_per_worker=max_inflight_per_worker,
    )
