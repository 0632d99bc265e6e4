"""One NATS connection per runtime, and how it rides through server restarts.

After the first connect succeeds, nats-py reconnects forever and replays our subscriptions; the
planes only need to hear when the link drops and comes back (discovery pauses its leases and
re-announces, see ``nats_discovery``). nats-py takes those callbacks at connect time, before
the planes exist, so ``ConnectionEvents`` collects listeners and the callbacks fan out to them.

Reconnect timing: the first attempt is immediate, then the wait doubles from
``RECONNECT_WAIT_MIN_S`` to ``RECONNECT_WAIT_MAX_S`` (the cap bounds how late a restarted server
is noticed; at most two attempts a second while it stays down is no busy loop). nats-py has no
backoff of its own, so failed attempts (reported to ``error_cb``) grow the wait it reads.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import Any

import nats
from nats.aio.client import Client as NatsClient

from interlock.errors import AuthError, ConfigError, TransportError
from interlock.runtime.config import NatsAuth, RuntimeConfig

RECONNECT_WAIT_MIN_S = 0.1
RECONNECT_WAIT_MAX_S = 0.5
PENDING_BYTES = 1 << 20
"""Publishes buffered while disconnected; past this they are refused (the event plane drops
them). Bounded because what piles up in an outage is stale once subscribers re-sync."""
PING_INTERVAL_S = 5
"""A server that vanished without closing the socket (host down, partition) is noticed after
``MAX_OUTSTANDING_PINGS`` unanswered pings: 10-15 s, instead of nats-py's 4-6 min default."""
MAX_OUTSTANDING_PINGS = 2


class ConnectionEvents:
    """Listeners for the link to the NATS server going down and coming back. Synchronous:
    a listener that needs I/O starts a task."""

    def __init__(self) -> None:
        self._lost: list[Callable[[], None]] = []
        self._restored: list[Callable[[], None]] = []

    def on_lost(self, listener: Callable[[], None]) -> None:
        self._lost.append(listener)

    def on_restored(self, listener: Callable[[], None]) -> None:
        self._restored.append(listener)

    def lost(self) -> None:
        for listener in self._lost:
            listener()

    def restored(self) -> None:
        for listener in self._restored:
            listener()


def auth_options(auth: NatsAuth) -> dict[str, Any]:
    """nats-py ``connect`` keywords for these credentials and TLS settings."""
    options: dict[str, Any] = {}
    if auth.user is not None:
        options.update(user=auth.user, password=auth.password)
    if auth.token is not None:
        options["token"] = auth.token
    if auth.creds_file is not None:
        options["user_credentials"] = auth.creds_file
    if auth.tls:
        try:
            context = ssl.create_default_context(cafile=auth.tls_ca)
            if auth.tls_cert is not None:
                context.load_cert_chain(auth.tls_cert, auth.tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"NATS TLS files: {exc}", param="nats_auth") from None
        options["tls"] = context
    return options


async def connect_nats(url: str, config: RuntimeConfig, name: str, events: ConnectionEvents) -> NatsClient:
    """Connect once (TransportError fast if the server is not there), then reconnect forever."""
    connected: list[NatsClient] = []  # the callbacks are made before the client exists
    first_errors: list[Exception] = []  # why the first connect failed (nats-py hides it)

    def set_wait(seconds: float) -> None:
        if connected:
            connected[0].options["reconnect_time_wait"] = seconds

    async def on_error(exc: Exception) -> None:
        # Mostly failed reconnect attempts: back off. Other errors (slow consumer) also land
        # here; the wait they grow only matters after the next disconnect, which resets it.
        if connected:
            set_wait(min(RECONNECT_WAIT_MAX_S, connected[0].options["reconnect_time_wait"] * 2))
        else:
            first_errors.append(exc)

    async def on_disconnected() -> None:
        set_wait(RECONNECT_WAIT_MIN_S)
        events.lost()

    async def on_reconnected() -> None:
        events.restored()

    try:
        # nats-py retries a failed *first* connect like a reconnect (60 attempts 2 s apart by
        # default, whatever allow_reconnect says); a worker given a wrong URL must fail fast.
        # And bounded as a whole: a TLS handshake that fails certificate checks was seen to
        # leave nats-py waiting forever.
        nc = await asyncio.wait_for(
            nats.connect(
                url,
                name=name,
                connect_timeout=max(1, round(config.connect_timeout)),
                max_reconnect_attempts=1,
                reconnect_time_wait=RECONNECT_WAIT_MIN_S,  # type: ignore[arg-type]  # int in its hints, any number works
                ping_interval=PING_INTERVAL_S,
                max_outstanding_pings=MAX_OUTSTANDING_PINGS,
                pending_size=PENDING_BYTES,
                error_cb=on_error,
                disconnected_cb=on_disconnected,
                reconnected_cb=on_reconnected,
                **auth_options(config.nats_auth),
            ),
            timeout=4 * max(1, round(config.connect_timeout)) + 2,
        )
    except TimeoutError:
        why = (
            " (TLS: does --nats-tls-ca name the CA that signed the server's certificate?)"
            if config.nats_auth.tls
            else ""
        )
        raise TransportError(
            f"cannot connect to NATS at {url}: no session after "
            f"{4 * max(1, round(config.connect_timeout)) + 2} s{why}"
        ) from None
    except Exception as exc:  # nats-py raises several unrelated types for "cannot connect"
        refused = [e for e in (exc, *first_errors) if "authorization" in str(e).lower()]
        if refused:
            raise AuthError(f"NATS at {url} refused our credentials ({refused[0]})") from None
        raise TransportError(f"cannot connect to NATS at {url}: {exc}") from None
    connected.append(nc)
    # Once connected, ride through server restarts for as long as it takes.
    nc.options["max_reconnect_attempts"] = -1
    return nc
