"""Frontend configuration: typed, frozen, validated once."""

from __future__ import annotations

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
    max_connections: int = 4096
    """Open connections at most; at the cap the oldest one with no request in flight is closed
    to make room (a 503 when all are busy)."""
    ssl_certfile: str | None = None
    """Serve HTTPS with this certificate chain (PEM) and ``ssl_keyfile``."""
    ssl_keyfile: str | None = None
    auth: AuthConfig = field(default_factory=AuthConfig)
    """API keys, the paths open without one, and per-key rate limits."""
    metric_families: frozenset[str] | None = None
    """Families of figures ``/metrics`` shows (``frontend.metrics.FAMILIES``); None: all."""
    handler_cancellation: bool = True
    """Cancel a request's handler when its client disconnects, so the backend aborts at once
    (used by ``serve_frontend``; pass it to your own ``AppRunner`` if you build one)."""

    def __post_init__(self) -> None:
        from interlock.frontend.metrics import FAMILIES

        unknown = set(self.metric_families or ()) - set(FAMILIES.values())
        if unknown:
            raise ConfigError(
                f"metric_families: unknown {sorted(unknown)} (known: {sorted(set(FAMILIES.values()))})"
            )
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
        for name in ("idle_timeout_s", "body_timeout_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be positive")
        if self.max_connections < 1:
            raise ConfigError("max_connections must be at least 1")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ConfigError("ssl_certfile and ssl_keyfile go together")
