"""The seam between the HTTP frontend and whatever serves tokens (router + workers, or a fake).

The frontend owns text: parsing, templates, tokenization, detokenization, stop strings and
the OpenAI shapes. A ``Backend`` owns tokens: it takes a ``GenerateRequest`` (token ids and
sampling parameters) and streams ``GenerateOutput`` chunks back.

Contract of ``Backend.generate``:

* errors that prevent serving are raised as ``interlock.errors`` subclasses (``NoWorkers``,
  ``Overloaded``, ``EngineError``, ...), preferably before the first output, so the client gets
  the right HTTP status; an error raised later reaches a streaming client as an SSE error event;
* the stream ends after the output whose ``finish_reason`` is set;
* the iterator being closed (``aclose``) or cancelled before that means the client went away or a
  stop string matched: the backend must abort the request on its worker.

``ModelEntry`` and ``RequestContext`` live in ``interlock.protocol.routing`` (the router service
implements this protocol without importing the frontend).

Optional, for ``/health``: ``health()`` lists what keeps a served model from being served at
all (a model with no live worker: 503); ``degraded()`` what is wrong while requests are still
served (a worker restarting or crash looping, the control plane unreachable: 200,
``"status": "degraded"``), so a load balancer never takes a serving frontend out;
``health_details()`` a mapping added to the body (the control plane's state).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Protocol

from interlock.protocol import GenerateOutput, GenerateRequest
from interlock.protocol.routing import ModelEntry, RequestContext

# Request headers read into RequestContext (lower case; aiohttp matches case-insensitively).
HEADER_REQUEST_ID = "x-request-id"
HEADER_SESSION_ID = "x-session-id"
HEADER_ROUTE_KEY = "x-route-key"
HEADER_PRIORITY = "x-priority"
HEADER_EXPLAIN = "x-interlock-explain"
HEADER_WORKER_ID = "x-worker-id"
"""Direct routing: serve the request on this worker (an operator's or a test's pin)."""


class Backend(Protocol):
    def models(self) -> list[ModelEntry]:
        """The models servable now; may change at run time as workers come and go."""
        ...

    def generate(self, request: GenerateRequest, ctx: RequestContext) -> AsyncIterator[GenerateOutput]:
        """Stream outputs for ``request``; see the module docstring for the contract."""
        ...

    def prefetch(self, model: str) -> None:
        """A request for ``model`` arrived and is about to be prepared: start whatever its
        serving needs that can start now (weights an idle worker offloaded). Never raises."""
        ...


def truthy(value: str | None) -> bool:
    return value is not None and value.strip().lower() in ("1", "true", "yes", "on")


def header_context(
    headers: Mapping[str, str], *, request_id: str, endpoint: str, route_key_header: str = HEADER_ROUTE_KEY
) -> RequestContext:
    """Build a RequestContext from request headers. Raises ValueError on a non-integer priority."""
    priority = headers.get(HEADER_PRIORITY)
    return RequestContext(
        request_id=request_id,
        endpoint=endpoint,
        session_id=headers.get(HEADER_SESSION_ID),
        route_key=headers.get(route_key_header),
        priority=int(priority) if priority else 0,
        worker_id=headers.get(HEADER_WORKER_ID),
        explain=truthy(headers.get(HEADER_EXPLAIN)),
    )
