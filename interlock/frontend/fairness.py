"""Who gives way when the frontend is full: the pure decisions behind the connection cap.

Every open connection belongs to a *client*, its peer address (an IPv6 address counts by its
/64, what one host is usually given), and is in one of three states: ``IDLE`` (no request: between
keep-alive requests, or still sending a request head), ``RECEIVING`` (a request whose body is
still arriving) or ``SERVING`` (body read, the request running).

A newcomer is admitted in this order (``admit``):

1. its client already holds ``max_client_connections``: it takes the slot of its own client's
   oldest idle connection, or is refused;
2. fewer than ``max_connections`` regular connections are open: it gets a regular slot;
3. it takes the slot of a regular connection that is not serving: from the client holding the
   most connections, its idle ones before those receiving a body, oldest first; but only its own
   client's idle ones, or any of a client holding more connections than its own (max-min
   fairness: a crowd from one address gives way to everyone else, never the reverse);
4. it gets one of ``reserved_connections`` extra slots, taken from reserve connections the same
   way when they are all open; a reserve connection serves only ``RESERVED_PATHS``, so /health,
   /live and /metrics answer even while every regular slot is serving a request;
5. otherwise it is refused.

A connection whose body is still arriving may be closed to make room because it has cost nothing
but a socket yet, and it is exactly what a slow-body crowd holds (a slow body is also cut by the
minimum transfer rate, ``body.py``); a serving one has a request on a worker and is never closed
to make room.

At the cap a newcomer costs one pass over the open connections, as the plain oldest-idle search
it replaces did.

Requests in flight are capped per client too (``InFlight``): per address, and per API key when
the request carries one, so neither many connections nor many addresses buy one client more.
"""

from __future__ import annotations

import enum
import ipaddress
from collections import Counter
from collections.abc import Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

RESERVED_PATHS = frozenset({"/health", "/live", "/metrics"})


class State(enum.IntEnum):
    """What a connection is doing; lower values give way first."""

    IDLE = 0
    RECEIVING = 1
    SERVING = 2


class Slot(Protocol):
    """What the decision reads of an open connection."""

    @property
    def client(self) -> str: ...

    @property
    def state(self) -> State: ...


S = TypeVar("S", bound=Slot)


@dataclass(frozen=True)
class ConnectionLimits:
    """The connection fields of ``FrontendConfig`` (validated there)."""

    max_connections: int
    max_client_connections: int
    reserved_connections: int


@dataclass(frozen=True)
class Admit(Generic[S]):
    reserve: bool
    """Admitted into a reserve slot (``RESERVED_PATHS`` only)."""
    evict: S | None = None
    """The connection to close first, whose slot the newcomer takes."""


def admit(
    client: str,
    regular: Collection[S],
    reserve: Collection[S],
    counts: Mapping[str, int],
    limits: ConnectionLimits,
) -> Admit[S] | None:
    """Where a newcomer from ``client`` goes (None: refused). ``regular`` and ``reserve`` are the
    open connections oldest first; ``counts`` the open connections per client, both pools."""
    own = counts.get(client, 0)
    if own >= limits.max_client_connections:
        for pool, is_reserve in ((regular, False), (reserve, True)):
            victim = next((c for c in pool if c.client == client and c.state == State.IDLE), None)
            if victim is not None:
                return Admit(is_reserve, victim)
        return None
    if len(regular) < limits.max_connections:
        return Admit(False)
    victim = _victim(client, regular, counts)
    if victim is not None:
        return Admit(False, victim)
    if len(reserve) < limits.reserved_connections:
        return Admit(True)
    victim = _victim(client, reserve, counts)
    return Admit(True, victim) if victim is not None else None


def _victim(client: str, pool: Collection[S], counts: Mapping[str, int]) -> S | None:
    own = counts.get(client, 0)
    best: S | None = None
    best_key: tuple[int, int] | None = None
    for conn in pool:  # oldest first: the first of equal keys wins
        state = conn.state
        if state == State.SERVING:
            continue
        theirs = counts.get(conn.client, 0)
        if conn.client == client:
            if state != State.IDLE:
                continue  # never cut one's own upload to open another connection
        elif theirs <= own:
            continue
        key = (-theirs, int(state))
        if best_key is None or key < best_key:
            best, best_key = conn, key
    return best


def client_of(peer: object) -> str:
    """The client a peer address counts as: the IP, an IPv6 one by its /64 prefix."""
    host = peer[0] if isinstance(peer, tuple) and peer else peer
    if not isinstance(host, str):
        return "?"
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host  # a unix socket path, say
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


class InFlight:
    """Requests in flight per identity (an address, an API key), each held to ``cap``."""

    def __init__(self, cap: int) -> None:
        assert cap >= 1, "validated by FrontendConfig"
        self.cap = cap
        self._count: Counter[Hashable] = Counter()

    def admit(self, identities: Sequence[Hashable]) -> bool:
        """Count a request against every identity, or refuse it (counting nothing)."""
        if any(self._count[i] >= self.cap for i in identities):
            return False
        for i in identities:
            self._count[i] += 1
        return True

    def release(self, identities: Sequence[Hashable]) -> None:
        for i in identities:
            self._count[i] -= 1
            if self._count[i] <= 0:
                del self._count[i]

    def __len__(self) -> int:
        """Identities with a request in flight (0 once all are released)."""
        return len(self._count)
