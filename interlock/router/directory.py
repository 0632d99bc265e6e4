"""What the dispatcher and the disaggregated flow need from the service that owns them.

``RouterService`` owns both and hands each only this: the worker directory (who is where, their
last load report, the request plane, a model's router once it has a worker) and, for the
dispatcher, the disaggregated flow's three calls. Neither holds the whole service, so the three
modules form no import circle (``tests/test_import_graph.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from interlock.protocol import GenerateOutput, GenerateRequest, InstanceInfo, LoadReport
from interlock.router.admission import RequestMeta
from interlock.router.decision import Decision
from interlock.router.model_router import Router
from interlock.runtime.interfaces import RequestPlane


@dataclass(slots=True)
class Leg:
    """What the next stream is: where, what to send, and how its output joins the response."""

    decision: Decision
    request: GenerateRequest
    skip_first: bool = False
    """The worker repeats a token the client already has (a disaggregated decode's first chunk)."""
    held_tokens: int = 0
    """Prompt tokens the disaggregated flow counts as pending on this worker until it starts."""


class WorkerDirectory(Protocol):
    @property
    def requests(self) -> RequestPlane:
        """The request plane (streams to workers, control calls)."""
        ...

    def instance(self, instance_id: str) -> InstanceInfo | None:
        """The routed worker's registration (None: gone, or never routed)."""
        ...

    def instances(self) -> list[InstanceInfo]: ...

    async def looked_up(self, router: Router, hashes: list[int]) -> list[int]:
        """``hashes``, with a replica's prefix lookup attached where this router keeps no KV
        index of its own (``kv_lookup.RemoteChain``); as they are otherwise."""
        ...

    def has_prefill(self, router: Router) -> bool:
        """``router``'s model has a routed prefill worker (a count, not a scan)."""
        ...

    def report(self, instance_id: str) -> LoadReport | None:
        """The worker's last load report."""
        ...

    async def router_when_ready(
        self, model: str, timeout_s: float, role: str | None = None, *, arriving: bool = False
    ) -> Router | None:
        """The model's router once it has an eligible worker (of ``role``), None after the
        timeout; the wait counts as the model's (the planner sees it). ``arriving``: a new
        request, refused (``Overloaded``) when too many already wait."""
        ...

    def share(self, router: Router) -> None:
        """Send this router's dispatch events to the other routers."""
        ...


class PrefillFlow(Protocol):
    """The disaggregated flow, as the dispatcher drives it (``router.disagg_flow.DisaggFlow``)."""

    def active(self, router: Router, request: GenerateRequest) -> bool: ...

    async def prepare(
        self, router: Router, request: GenerateRequest, meta: RequestMeta, hashes: list[int]
    ) -> tuple[GenerateOutput | None, Leg | None]: ...

    def release(self, worker_id: str, tokens: int) -> int: ...
