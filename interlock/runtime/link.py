"""This process's link to the control plane (NATS): up or down, since when, and who to tell.

Two things can cut a process off: the connection drops (nats-py notices and reconnects), or the
server stops answering while the socket stays open (a hung or overloaded nats-server, a
partition that drops packets): nats-py notices only after its stale-ping limit, 10-15 s later.
``nats_connection`` feeds this object from both: nats-py's disconnect/reconnect callbacks and a
probe that publishes to itself through the server every fraction of a second. Either may say
"lost" or "restored" first; both are idempotent here, so listeners hear each change once.

Listeners (discovery, the event plane) are synchronous; one that needs I/O starts a task. While
the link is down, silence from others proves nothing (discovery suspends its leases) and
publishes would arrive stale (the event plane drops them; subscribers re-sync on restore).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LinkStatus:
    state: Literal["connected", "unreachable"]
    since_s: float
    """Seconds in this state."""
    reason: str
    """Why it is unreachable ("" while connected)."""
    outages: int
    """Times the link went down since start."""


class ControlLink:
    def __init__(self, name: str = "nats") -> None:
        self.name = name
        self._up = True
        self._since = time.monotonic()
        self._reason = ""
        self._outages = 0
        self._lost: list[Callable[[], None]] = []
        self._restored: list[Callable[[], None]] = []

    @property
    def up(self) -> bool:
        return self._up

    def on_lost(self, listener: Callable[[], None]) -> None:
        self._lost.append(listener)

    def on_restored(self, listener: Callable[[], None]) -> None:
        self._restored.append(listener)

    def lost(self, reason: str) -> None:
        if not self._up:
            return
        self._up, self._since, self._reason = False, time.monotonic(), reason
        self._outages += 1
        log.warning("control plane (%s) unreachable: %s", self.name, reason)
        for listener in self._lost:
            listener()

    def restored(self) -> None:
        if self._up:
            return
        down_s = time.monotonic() - self._since
        self._up, self._since, self._reason = True, time.monotonic(), ""
        log.warning("control plane (%s) reachable again after %.1f s", self.name, down_s)
        for listener in self._restored:
            listener()

    def status(self) -> LinkStatus:
        return LinkStatus(
            "connected" if self._up else "unreachable",
            time.monotonic() - self._since,
            self._reason,
            self._outages,
        )
