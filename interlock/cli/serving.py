"""What ``serve`` and ``frontend`` share: the router service behind the HTTP frontend."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

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


def router_config(routing: Routing, *, max_inflight_per_worker: int = 0) -> RouterConfig:
    from interlock.router.cost import CostParams

    return RouterConfig(
        policy=routing.policy,
        cost=CostParams(kv_watermark=routing.kv_usage_watermark),
        queue_capacity=routing.queue_size,
        max_inflight_per_worker=max_inflight_per_worker,
    )


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"
