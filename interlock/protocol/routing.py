"""What crosses from the HTTP frontend to whatever serves tokens (the router, or a fake).

Defined once here so that the frontend (``frontend.backend.Backend``) and the router service
(which implements that protocol) share them without importing each other.

``ModelEntry`` is a served model as clients see it. ``RequestContext`` carries a request's
routing hints, read from HTTP headers, and a dict where the backend may put headers for the
response (an explain header, say); they leave with the response, so the backend sets them
before its first output. ``Completion`` is one finished request as the router's dispatcher
saw it, for the planner. Not wire types: they never leave the frontend's process.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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
    worker_id: str | None = None
    """Pin the request to this worker (direct routing); None: the policy decides."""
    explain: bool = False
    """The client asked for the routing decision to be explained (in a response header)."""
    response_headers: dict[str, str] = field(default_factory=dict)
    """Filled by the backend; sent with the HTTP response."""
    workers: list[str] = field(default_factory=list)
    """Filled by the router: the workers of the legs the request streamed, in order (a retry or
    a migration adds one; a disaggregated request's decode worker, not yet its prefill worker),
    for the access log."""
    migrations: int = 0
    """Filled by the router: times the request moved to another worker mid-stream."""


@dataclass(frozen=True, slots=True)
class Completion:
    """One request that finished (for the planner: what it cost, what it got)."""

    arrived_s: float
    """``time.monotonic()`` when the dispatcher took it."""
    ttft_s: float
    decode_s: float
    """From its first token to its last."""
    output_tokens: int
    prompt_tokens: int
    cached_tokens: int
    """Its prompt tokens found in a prefix cache where the prompt was computed (the engine's
    count, the prefill worker's for a remote prefill; the router's estimate if none came)."""
    model: str = ""
    """The model it asked for (its router's)."""
