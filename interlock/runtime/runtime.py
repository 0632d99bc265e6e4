"""The Runtime bundle and its one factory, ``connect_runtime``.

``connect_runtime(None)`` gives the in-process planes (one shared registry per process, or
the one passed in); ``connect_runtime("nats://...")`` gives NATS discovery and events with the
direct TCP request plane (or NATS request/reply with ``request_plane="nats"``).
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType

from interlock.protocol import InstanceInfo
from interlock.runtime.config import RuntimeConfig
from interlock.runtime.inproc import InProcDiscovery, InProcEventPlane, InProcRegistry, InProcRequestPlane
from interlock.runtime.interfaces import Discovery, EventPlane, RequestPlane
from interlock.runtime.link import ControlLink
from interlock.runtime.nats_connection import connect_nats, probe_link, probe_timeout_s
from interlock.runtime.nats_discovery import NatsDiscovery
from interlock.runtime.nats_events import NatsEventPlane
from interlock.runtime.nats_requests import NatsRequestPlane
from interlock.runtime.tcp import TcpRequestPlane

_default_registries: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, InProcRegistry] = (
    weakref.WeakKeyDictionary()
)


def default_registry() -> InProcRegistry:
    """The registry every in-process runtime on this event loop shares unless given another.

    One per loop, because its timers and queues belong to a loop: a second ``asyncio.run`` (the
    next test) starts from an empty registry instead of inheriting dead leases."""
    loop = asyncio.get_running_loop()
    registry = _default_registries.get(loop)
    if registry is None:
        registry = _default_registries[loop] = InProcRegistry()
    return registry


@dataclass
class Runtime:
    discovery: Discovery
    requests: RequestPlane
    events: EventPlane
    config: RuntimeConfig
    link: ControlLink | None = None
    """This process's link to NATS (None in-process: there is no link to lose)."""
    _extra_close: list[Callable[[], Awaitable[None]]] = field(default_factory=list, repr=False)
    _closed: bool = field(default=False, repr=False)

    async def close(self) -> None:
        """Unregister, stop serving (cancelling in-flight calls), drop subscriptions, disconnect.
        To drain first, ``discovery.unregister`` and wait for your in-flight calls yourself."""
        if self._closed:
            return
        self._closed = True
        await self.discovery.close()
        await self.requests.close()
        await self.events.close()
        for close in self._extra_close:
            await close()

    async def __aenter__(self) -> Runtime:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


async def connect_runtime(
    nats_url: str | None,
    config: RuntimeConfig | None = None,
    *,
    registry: InProcRegistry | None = None,
    name: str = "interlock",
) -> Runtime:
    """NATS-backed runtime when ``nats_url`` is given, else the in-process one.

    ``name`` is the NATS connection's name, as nats-server's ``/connz`` lists it: say the
    process's role (``interlock-frontend``, ``interlock-worker-<id>``). NATS discovery starts
    its table on first use (``instances``, ``watch``), not here: a worker that only registers
    never hears the others' heartbeats (``nats_discovery``)."""
    config = config or RuntimeConfig()
    if nats_url is None:
        registry = registry or default_registry()
        return Runtime(
            InProcDiscovery(registry, config),
            InProcRequestPlane(registry),
            InProcEventPlane(registry),
            config,
        )
    link = ControlLink()
    nc = await connect_nats(nats_url, config, name, link)
    requests: RequestPlane
    requests = NatsRequestPlane(nc, config) if config.request_plane == "nats" else TcpRequestPlane(config)

    async def vouch(info: InstanceInfo) -> bool:
        """A silent instance that answers a ping on its request plane is alive (over the NATS
        request plane that proves nothing new: the same server carries both)."""
        if config.request_plane == "nats":
            return False
        try:
            await requests.ping(info.address, timeout=config.connect_timeout)
        except Exception:  # noqa: BLE001 - TransportError, or a check that broke: not alive
            return False
        return True

    discovery = NatsDiscovery(nc, config, vouch)
    link.on_lost(discovery.connection_lost)
    link.on_restored(discovery.connection_restored)
    prober = asyncio.create_task(probe_link(nc, link, probe_timeout_s(config)), name="nats-link-probe")

    async def disconnect() -> None:
        prober.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await prober
        if not nc.is_closed:
            try:
                if nc.is_connected:  # reconnecting, it would only wait out the timeout
                    await nc.flush(timeout=max(1, round(config.connect_timeout)))  # the bye goes out
            except Exception:
                pass  # server already gone: nothing left to deliver
            try:
                await nc.close()
            except (RuntimeError, OSError):
                # The socket died under it (the nats-server stopped with us, as when a process
                # group gets SIGTERM): nats-py still writes its pending buffer into the closed
                # transport, which uvloop refuses. Nothing is left to deliver or to release.
                pass

    return Runtime(discovery, requests, NatsEventPlane(nc, link), config, link, [disconnect])
