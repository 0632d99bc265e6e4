"""Frontend configuration: typed, frozen, validated once."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from interlock.errors import ConfigError
from interlock.frontend.auth import AuthConfig
from interlock.frontend.backend import HEADER_ROUTE_KEY
from interlock.frontend.limits import DEFAULT_MAX_JSON_DEPTH, DEFAULT_MAX_PROMPT_CHARS


@dataclass(frozen=True)
class FrontendConfig:
    route_key_header: str = HEADER_ROUTE_KEY
    """Request header whose value becomes ``RequestContext.route_key``."""
    max_body_bytes: int = 32 * 1024 * 1024
    """Largest accepted request body (413 beyond)."""
    max_prompt_chars: int = DEFAULT_MAX_PROMPT_CHARS
    """Largest prompt in characters, checked before tokenizing (a chat prompt both as sent and as
    rendered by its template; a list of token ids counts one per id)."""
    max_prompt_tokens: int | None = None
    """Largest prompt in tokens; None: only the model's context length bounds it."""
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH
    """Deepest nesting of arrays/objects accepted in a request body."""
    idle_timeout_s: float = 75.0
    """An open connection without a complete request head is closed after this long: idle
    between requests (keep-alive), or sending its headers too slowly."""
    body_timeout_s: float = 60.0
    """Time to receive a request's whole body once its head arrived (408 beyond)."""
    min_body_rate: int = 1024
    """Bytes a second a request body must average once ``body_grace_s`` has passed (408 below
    it); 0: only ``body_timeout_s`` bounds a slow body."""
    body_grace_s: float = 5.0
    """Time a request body may take before ``min_body_rate`` applies."""
    max_connections: int = 4096
    """Regular open connections at most. At the cap a newcomer takes the slot of a connection
    with no request being served (idle first, then one whose body is still arriving) from the
    client holding the most connections, if that client holds more than the newcomer's does
    (``fairness.py``); else it gets a reserve slot."""
    max_client_connections: int = 1024
    """Open connections one client (peer address; an IPv6 /64) may hold; at the cap its own
    oldest idle one makes room, else the newcomer is refused (503). Behind a proxy every client
    is the proxy: raise it to ``max_connections``."""
    reserved_connections: int = 8
    """Connections beyond ``max_connections`` that serve only /health, /live and /metrics, so
    probes answer while every regular connection is serving (0: none)."""
    max_client_requests: int = 1024
    """Generation requests in flight per client address, and per API key when the request
    carries one (429 beyond)."""
    max_header_chars: int = 256
    """Longest value of a request header the server keeps (``KEPT_HEADERS`` and the route-key
    header: routing tables, logs, the echoed id); longer is a 400 naming the header."""
    max_stream_buffer_bytes: int = 256 * 1024
    """Bytes of a stream its client has not read that the frontend holds; past it the stream
    waits for the client (``generation.py``)."""
    stream_stall_timeout_s: float = 30.0
    """How long a stream waits for its client to read before it is aborted."""
    ssl_certfile: str | None = None
    """Serve HTTPS with this certificate chain (PEM) and ``ssl_keyfile``."""
    ssl_keyfile: str | None = None
    auth: AuthConfig = field(default_factory=AuthConfig)
    """API keys, the paths open without one, and per-key rate limits."""
    metric_families: frozenset[str] | None = None
    """Groups of figures ``/metrics`` shows (``metrics.catalog.GROUPS``, docs/metrics.md); None: all."""
    handler_cancellation: bool = True
    """Cancel a request's handler when its client disconnects, so the backend aborts at once
    (used by ``serve_frontend``; pass it to your own ``AppRunner`` if you build one)."""

    def __post_init__(self) -> None:
        from interlock.metrics.catalog import GROUPS

        unknown = set(self.metric_families or ()) - set(GROUPS)
        if unknown:
            raise ConfigError(f"metric_families: unknown {sorted(unknown)} (known: {sorted(GROUPS)})")
        if not self.route_key_header or self.route_key_header != self.route_key_header.strip():
            raise ConfigError("route_key_header must be a header name")
        if self.max_body_bytes < 1024:
            raise ConfigError("max_body_bytes must be at least 1024")
        if self.max_prompt_chars < 1:
            raise ConfigError("max_prompt_chars must be at least 1")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise ConfigError("max_prompt_tokens must be at least 1 (or None)")
        if self.max_json_depth < 2:
            raise ConfigError("max_json_depth must be at least 2")
        for name in ("idle_timeout_s", "body_timeout_s", "body_grace_s", "stream_stall_timeout_s"):
            if not 0 < getattr(self, name) < math.inf:
                raise ConfigError(f"{name} must be a positive number of seconds")
        for name in ("max_connections", "max_client_connections", "max_client_requests", "max_header_chars"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1")
        if self.reserved_connections < 0 or self.min_body_rate < 0:
            raise ConfigError("reserved_connections and min_body_rate must be at least 0")
        if self.max_stream_buffer_bytes < 16 * 1024:
            raise ConfigError("max_stream_buffer_bytes must be at least 16384")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ConfigError("ssl_certfile and ssl_keyfile go together")
