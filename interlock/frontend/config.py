"""Frontend configuration: typed, frozen, validated once."""

from __future__ import annotations

from dataclasses import dataclass

from interlock.errors import ConfigError
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
    handler_cancellation: bool = True
    """Cancel a request's handler when its client disconnects, so the backend aborts at once
    (used by ``serve_frontend``; pass it to your own ``AppRunner`` if you build one)."""

    def __post_init__(self) -> None:
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
