"""One NATS connection per runtime, and how it rides through server restarts and hangs.

After the first connect succeeds, nats-py reconnects forever and replays our subscriptions; the
planes only need to hear when the link drops and comes back (discovery pauses its leases and
re-announces, see ``nats_discovery``). nats-py takes those callbacks at connect time, before
the planes exist, so a ``ControlLink`` (``runtime.link``) collects listeners and the callbacks
fan out to them.

A server that hangs (SIGSTOP, overload, a partition that drops packets) keeps the socket open:
nats-py would notice only after ``MAX_OUTSTANDING_PINGS`` pings, 10-15 s in, long after every
lease ran out. ``probe_link`` publishes to a subject of our own every ``PROBE_INTERVAL_S`` and
says the link is lost when no probe came back for ``probe_timeout_s`` (a fraction of the lease
timeout, so leases are suspended before they could expire for want of heartbeats). A check
that ran late (our own event loop was busy) proves nothing and is skipped. With several servers
(``nats://a:4222,nats://b:4222``: a cluster), a hang that lasts ``FAILOVER_AFTER_S`` makes
nats-py reconnect to another server of the list.

Reconnect timing: the first attempt is immediate, then the wait doubles from
``RECONNECT_WAIT_MIN_S`` to ``RECONNECT_WAIT_MAX_S`` (the cap bounds how late a restarted server
is noticed; at most two attempts a second while it stays down is no busy loop). nats-py has no
backoff of its own, so failed attempts (reported to ``error_cb``) grow the wait it reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from typing import Any

import nats
from nats.aio.client import Client as NatsClient

from interlock.errors import AuthError, ConfigError, TransportError
from interlock.runtime.config import NatsAuth, RuntimeConfig
from interlock.runtime.link import ControlLink

RECONNECT_WAIT_MIN_S = 0.1
RECONNECT_WAIT_MAX_S = 0.5
PENDING_BYTES = 1 << 20
"""Publishes buffered while disconnected; past this they are refused (the event plane drops
them). Bounded because what piles up in an outage is stale once subscribers re-sync."""
PING_INTERVAL_S = 5
"""A server that vanished without closing the socket (host down, partition) is noticed after
``MAX_OUTSTANDING_PINGS`` unanswered pings: 10-15 s, instead of nats-py's 4-6 min default."""
MAX_OUTSTANDING_PINGS = 2
PROBE_INTERVAL_S = 0.25
FAILOVER_AFTER_S = 3.0
"""A hang this long with other servers listed: reconnect to one of them."""


def server_urls(url: str) -> list[str]:
    """``nats://a:4222,nats://b:4222`` (the servers of one cluster) as a list."""
    urls = [u.strip() for u in url.split(",") if u.strip()]
    if not urls:
        raise ConfigError("no NATS server URL given", param="nats_url")
    return urls


def probe_timeout_s(config: RuntimeConfig) -> float:
    """Silence after which the link counts as lost: well inside a lease, above loopback jitter."""
    return max(4 * PROBE_INTERVAL_S, min(2.0, config.lease_timeout / 3))


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


def _connect_options(config: RuntimeConfig) -> dict[str, Any]:
    """nats-py's timing, buffering and credentials for ``config``."""
    return {
        "connect_timeout": max(1, round(config.connect_timeout)),
        "max_reconnect_attempts": 1,
        "reconnect_time_wait": RECONNECT_WAIT_MIN_S,
        "ping_interval": PING_INTERVAL_S,
        "max_outstanding_pings": MAX_OUTSTANDING_PINGS,
        "pending_size": PENDING_BYTES,
        # A publish that finds the buffer full waits this long for the socket, not for ever: a
        # hung server must not freeze a publisher (the event plane drops instead).
        "flush_timeout": config.connect_timeout,
        **auth_options(config.nats_auth),
    }


async def connect_nats(url: str, config: RuntimeConfig, name: str, link: ControlLink) -> NatsClient:
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
        link.lost("disconnected from the NATS server")

    async def on_reconnected() -> None:
        link.restored()

    try:
        # nats-py retries a failed *first* connect like a reconnect (60 attempts 2 s apart by
        # default, whatever allow_reconnect says); a worker given a wrong URL must fail fast.
        # And bounded as a whole: a TLS handshake that fails certificate checks was seen to
        # leave nats-py waiting forever.
        nc = await asyncio.wait_for(
            nats.connect(
                server_urls(url),
                name=name,
                error_cb=on_error,
                disconnected_cb=on_disconnected,
                reconnected_cb=on_reconnected,
                **_connect_options(config),
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


async def probe_link(nc: NatsClient, link: ControlLink, timeout_s: float) -> None:
    """Run for the connection's life: publish a probe to ourselves through the server and mark
    the link lost when none came back for ``timeout_s`` (see the module note)."""
    last_echo = time.monotonic()

    async def on_echo(_msg: Any) -> None:
        nonlocal last_echo
        last_echo = time.monotonic()
        link.restored()

    def on_restored() -> None:  # a reconnect: count the silence from now
        nonlocal last_echo
        last_echo = time.monotonic()

    link.on_restored(on_restored)
    subject = nc.new_inbox()
    sub = await nc.subscribe(subject, cb=on_echo)
    sender = asyncio.create_task(_send_probes(nc, subject), name="nats-probe")
    try:
        checked = time.monotonic()
        while not nc.is_closed:
            await asyncio.sleep(PROBE_INTERVAL_S)
            now = time.monotonic()
            late = now - checked > timeout_s / 2  # our loop was blocked: the echo may be unread
            checked = now
            if late or not nc.is_connected:
                continue  # a disconnect is nats-py's to report
            silent_s = now - last_echo
            if silent_s > timeout_s:
                link.lost(f"the NATS server has not answered for {silent_s:.1f} s")
                if silent_s > FAILOVER_AFTER_S and len(nc.servers) > 1:
                    await nc.force_reconnect()
                    last_echo = time.monotonic()
    finally:
        sender.cancel()
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


async def _send_probes(nc: NatsClient, subject: str) -> None:
    while not nc.is_closed:
        await asyncio.sleep(PROBE_INTERVAL_S)
        if nc.is_connected:
            with contextlib.suppress(Exception):  # a full buffer or a closing client: try again
                await nc.publish(subject, b"")
