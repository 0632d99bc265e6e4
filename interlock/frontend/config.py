"""Frontend configuration: typed, frozen, validated once."""

from __future__ import annotations

from dataclasses import dataclass

from interlock.errors import ConfigError
from interlock.frontend.backend import HEADER_ROUTE_KEY


@dataclass(frozen=True)
class FrontendConfig:
    route_key_header: str = HEADER_ROUTE_KEY
    """Request header whose value becomes ``RequestContext.route_key``."""
    max_body_bytes: int = 32 * 1024 * 1024
    """Largest accepted request body."""
    handler_cancellation: bool = True
    """Cancel a request's handler when its client disconnects, so the backend aborts at once
    (used by ``serve_frontend``; pass it to your own ``AppRunner`` if you build one)."""

    def __post_init__(self) -> None:
        if not self.route_key_header or self.route_key_header != self.route_key_header.strip():
            raise ConfigError("route_key_header must be a header name")
        if self.max_body_bytes < 1024:
            raise ConfigError("max_body_bytes must be at least 1024")
