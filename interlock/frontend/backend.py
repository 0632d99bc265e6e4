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

``RequestContext`` carries the HTTP headers the router cares about, and a dict where the backend
may put headers for the response (for example an explain header); they are sent with the
response, so the backend sets them before its first output.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from interlock.protocol import GenerateOutput, GenerateRequest

# Request headers read into RequestContext (lower case; aiohttp matches case-insensitively).
HEADER_REQUEST_ID = "x-request-id"
HEADER_SESSION_ID = "x-session-id"
HEADER_ROUTE_KEY = "x-route-key"
HEADER_PRIORITY = "x-priority"
HEADER_EXPLAIN = "x-interlock-explain"


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """One model the backend can serve right now."""

    name: str
    """What clients put in ``model``."""
    model_path: str
    """Local folder with ``tokenizer.json`` and ``tokenizer_config.json`` (chat template)."""
    context_length: int


@dataclass(slots=True)
class RequestContext:
    """Per-request routing hints from the HTTP headers, and response headers from the backend."""

    request_id: str
    endpoint: str
    """"chat" or "completions"."""
    session_id: str | None = None
    route_key: str | None = None
    priority: int = 0
    explain: bool = False
    """The client asked for the routing decision to be explained (in a response header)."""
    response_headers: dict[str, str] = field(default_factory=dict)
    """Filled by the backend; sent with the HTTP response."""


class Backend(Protocol):
    def models(self) -> list[ModelEntry]:
        """The models servable now; may change at run time as workers come and go."""
        ...

    def generate(self, request: GenerateRequest, ctx: RequestContext) -> AsyncIterator[GenerateOutput]:
        """Stream outputs for ``request``; see the module docstring for the contract."""
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
        explain=truthy(headers.get(HEADER_EXPLAIN)),
    )
