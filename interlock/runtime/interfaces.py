"""The three planes as small Protocols: discovery, request plane, event plane.

Components (frontend, router, worker) depend only on these; ``connect_runtime`` picks the
implementation (in-process, or NATS + TCP). Contracts every implementation keeps:

* Discovery: ``register`` keeps the instance alive by heartbeat until ``unregister``; an
  instance whose heartbeats stop leaves every watcher's table within its lease timeout.
  ``watch`` first yields ``added`` for each current instance, then changes as they happen; a
  ``removed`` says whether the instance left by ``unregister`` (``graceful``) or went silent.
* Request plane: a handler is an async generator function ``handler(payload, ctx)``.
  Closing or cancelling the client's iterator cancels the handler on the server (CancelledError
  at its current ``await``; its ``finally`` runs). A handler failure, a missing handler, a dead
  or silent server all raise ``TransportError`` in the client (an ``interlock.errors`` error
  raised by the handler is re-raised as the same class); nothing hangs past the configured
  timeouts.
* Event plane: fire-and-forget publish; a subscription receives every message published after
  ``subscribe`` returned, in publish order per publisher. NATS wildcards (``*``, ``>``) work.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from interlock.protocol import InstanceInfo
from interlock.runtime.naming import EndpointName
from interlock.runtime.subscription import Subscription


@dataclass(frozen=True, slots=True)
class DiscoveryEvent:
    kind: Literal["added", "removed"]
    instance: InstanceInfo
    graceful: bool = False
    """``removed`` only: the instance unregistered itself (a drain, a role change), so whatever
    it is serving goes on to its end; False when its lease ran out or a new registration replaced
    it (it died or restarted: its calls in flight are lost)."""


@dataclass(frozen=True, slots=True)
class CallContext:
    """What a handler knows about the call it serves."""

    key: str
    """Handler key: ``namespace.component.endpoint`` or that plus ``.instance_id``."""
    stream_id: int
    """Unique per connection (TCP) or per server (in-process, NATS); for logs."""


Handler = Callable[[bytes, CallContext], AsyncIterator[bytes]]
"""An async generator function: ``async def h(payload, ctx): yield b"..."``."""


class Discovery(Protocol):
    async def register(self, info: InstanceInfo) -> None:
        """Announce ``info`` and keep its lease alive by heartbeat (idempotent: re-register
        with new info replaces the old)."""
        ...

    async def unregister(self, instance_id: str) -> None:
        """Stop heartbeating and remove the instance everywhere now."""
        ...

    async def instances(self, endpoint: EndpointName | str) -> list[InstanceInfo]:
        """Live instances serving ``endpoint``, sorted by instance_id. The first look (this or
        ``watch``) may wait ``discovery_sync_s`` while the table fills."""
        ...

    def watch(self, endpoint: EndpointName | str | None = None) -> AsyncGenerator[DiscoveryEvent, None]:
        """Current instances as ``added``, then every change; ``None`` watches all endpoints.
        Close it (``aclose``/``aclosing``) when done."""
        ...

    def vouched(self) -> list[str]:
        """Instances whose lease ran out but that answer on their request plane (kept)."""
        ...

    async def close(self) -> None:
        """Unregister everything this client registered; end its watches."""
        ...


class RequestPlane(Protocol):
    async def serve(
        self, endpoint: EndpointName | str, handler: Handler, *, instance_id: str | None = None
    ) -> str:
        """Start serving ``handler``; return the address to put in ``InstanceInfo.address``."""
        ...

    async def unserve(self, address: str) -> None:
        """Refuse new calls to ``address``; calls in flight carry on."""
        ...

    def stream(self, address: str, payload: bytes) -> AsyncGenerator[bytes, None]:
        """Call the handler at ``address``; iterate its chunks. ``aclose`` it to cancel."""
        ...

    async def ping(self, address: str, timeout: float | None = None) -> float:
        """Round-trip to the server of ``address`` (seconds); TransportError if there is no
        handler there or no answer within ``timeout`` (default: connect timeout)."""
        ...

    async def close(self) -> None:
        """Stop serving (in-flight handlers are cancelled) and drop client connections."""
        ...


class EventPlane(Protocol):
    async def publish(self, subject: str, payload: bytes) -> None: ...

    async def subscribe(self, subject: str) -> Subscription:
        """Receive ``(subject, payload)`` for every later publish matching ``subject``."""
        ...

    async def close(self) -> None: ...
