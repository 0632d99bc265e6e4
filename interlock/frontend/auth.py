"""API keys and per-key rate limits.

A request to a protected path must carry ``Authorization: Bearer <key>`` with one of the
configured keys; it is compared with every key in constant time, so the reply's timing tells
nothing about how much of a key was right. The operational paths (``/health``, ``/live``,
``/metrics``) stay open by default so probes and scrapers need no secret. A browser cannot set
that header on the paths it opens itself (``BROWSER_PATHS``, the dashboard), so those also take
the key from the ``KEY_COOKIE`` cookie, or as ``?key=`` on the page (``frontend/dashboard_http.py``
turns that into the cookie and takes it out of the address).

Rate limits are token buckets per key, refilled continuously: ``requests_per_minute`` is taken
when a request arrives, ``tokens_per_minute`` is checked against the prompt before the request
runs and charged with its prompt and completion tokens (a bucket may go below zero on a long
completion; that key then waits until it refills). Over a limit: 429 with ``Retry-After``.
"""

from __future__ import annotations

import hmac
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from interlock.errors import ConfigError, RateLimited, Unauthorized

OPEN_PATHS = ("/health", "/live", "/metrics")
DASHBOARD_PAGE = "/dashboard"
BROWSER_PATHS = (DASHBOARD_PAGE, "/dashboard/events")
KEY_COOKIE = "interlock_key"


@dataclass(frozen=True)
class AuthConfig:
    api_keys: tuple[str, ...] = ()
    """Accepted keys; none: every path is open."""
    open_paths: tuple[str, ...] = OPEN_PATHS
    """Paths served without a key."""
    requests_per_minute: int | None = None
    """Per key; None: unlimited."""
    tokens_per_minute: int | None = None
    """Prompt plus completion tokens per key; None: unlimited."""

    def __post_init__(self) -> None:
        if any(not k or k != k.strip() for k in self.api_keys):
            raise ConfigError("API keys must be non-empty and have no surrounding whitespace")
        for name in ("requests_per_minute", "tokens_per_minute"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name} must be at least 1 (or unset)")
        if (self.requests_per_minute or self.tokens_per_minute) and not self.api_keys:
            raise ConfigError("rate limits are per API key: configure API keys too")


class TokenBucket:
    """``per_minute`` units a minute, at most ``per_minute`` saved up. Pure but for the clock."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity = float(per_minute)
        self.level = float(per_minute)
        self._rate = per_minute / 60.0
        self._clock = clock
        self._last = clock()

    def wait_for(self, amount: float) -> float:
        """Seconds until ``amount`` is available (0: available now). Takes nothing."""
        self._refill()
        needed = min(amount, self.capacity) - self.level  # a request larger than a minute's worth
        return max(0.0, needed / self._rate)  # waits for a full bucket, not forever

    def take(self, amount: float) -> None:
        self._refill()
        self.level -= amount

    def _refill(self) -> None:
        now = self._clock()
        self.level = min(self.capacity, self.level + (now - self._last) * self._rate)
        self._last = now


class Auth:
    """Checks keys (as middleware) and keeps each key's buckets."""

    def __init__(self, config: AuthConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._keys = [k.encode() for k in config.api_keys]
        rpm, tpm = config.requests_per_minute, config.tokens_per_minute
        self._requests = [TokenBucket(rpm, clock) for _ in self._keys] if rpm else None
        self._tokens = [TokenBucket(tpm, clock) for _ in self._keys] if tpm else None

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if self._keys and request.path not in self.config.open_paths:
            try:
                index = self.key_index(credential(request))
            except Unauthorized:
                if request.path not in BROWSER_PATHS:
                    raise
                raise Unauthorized(f"Missing or unknown API key: open {DASHBOARD_PAGE}?key=<key>") from None
            request[KEY_INDEX] = index
            if self._requests is not None:
                _take_or_refuse(self._requests[index], 1, "requests_per_minute")
        return await handler(request)

    def key_index(self, authorization: str) -> int:
        scheme, _, given = authorization.partition(" ")
        given_bytes = given.strip().encode()
        found = -1
        for i, key in enumerate(self._keys):  # every key compared: no early exit to time
            if hmac.compare_digest(key, given_bytes) and found < 0:
                found = i
        if scheme.lower() != "bearer" or found < 0:
            raise Unauthorized("Incorrect or missing API key. Send it as 'Authorization: Bearer <key>'.")
        return found

    def admit_tokens(self, request: web.Request, prompt_tokens: int) -> None:
        """Refuse a request whose key has not ``prompt_tokens`` left this minute; charge them."""
        if self._tokens is not None and KEY_INDEX in request:
            _take_or_refuse(self._tokens[request[KEY_INDEX]], prompt_tokens, "tokens_per_minute")

    def charge_tokens(self, request: web.Request, tokens: int) -> None:
        if self._tokens is not None and KEY_INDEX in request and tokens:
            self._tokens[request[KEY_INDEX]].take(tokens)


def credential(request: web.Request) -> str:
    """The request's ``Authorization`` value; on a browser path without one, the key from the
    page's ``?key=`` or else from the cookie, in the same form."""
    header = request.headers.get("Authorization")
    if header is not None or request.path not in BROWSER_PATHS:
        return header or ""
    query = request.query.get("key", "") if request.path == DASHBOARD_PAGE else ""
    key = query or request.cookies.get(KEY_COOKIE, "")
    return f"Bearer {key}" if key else ""


def _take_or_refuse(bucket: TokenBucket, amount: int, limit: str) -> None:
    wait = bucket.wait_for(amount)
    if wait > 0:
        raise RateLimited(
            f"rate limit reached for this API key ({limit}); retry in {math.ceil(wait)} s",
            retry_after=wait,
        )
    bucket.take(amount)


KEY_INDEX = web.RequestKey("interlock_api_key_index", int)
