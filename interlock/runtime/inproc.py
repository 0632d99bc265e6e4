"""In-process implementation of the three planes: one shared registry object per process.

Used by unit tests and by ``interlock serve --single-process``. Nothing is serialized beyond
what the interfaces carry (payloads are already bytes); a call runs its handler in its own
task so that cancellation and server shutdown behave as they do across processes.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncGenerator

from interlock.errors import TransportError
from interlock.protocol import InstanceInfo
from interlock.runtime.channel import Channel, Item, Opened, drain
from interlock.runtime.config import RuntimeConfig
from interlock.runtime.interfaces import CallContext, DiscoveryEvent, Handler
from interlock.runtime.leases import LeaseTable
from interlock.runtime.naming import EndpointName, check_token, subject_matches
from interlock.runtime.remote import remote_error, run_handler
from interlock.runtime.subscription import Subscription, Subscriptions

SCHEME = "inproc://"


class InProcRegistry:
    """State shared by every in-process runtime of one process (and one event loop)."""

    def __init__(self) -> None:
        self.leases = LeaseTable()
        self.handlers: dict[str, tuple[InProcRequestPlane, Handler]] = {}
        self.subscriptions: list[Subscription] = []
        self.stream_ids = itertools.count(1)


class InProcDiscovery:
    def __init__(self, registry: InProcRegistry, config: RuntimeConfig) -> None:
        self._registry = registry
        self._config = config
        self._heartbeats: dict[str, asyncio.Task[None]] = {}

    async def register(self, info: InstanceInfo) -> None:
        EndpointName.parse(info.endpoint)
        check_token(info.instance_id, "instance_id")
        self._stop_heartbeat(info.instance_id)
        self._registry.leases.refresh(info, self._config.lease_timeout)
        self._heartbeats[info.instance_id] = asyncio.create_task(self._heartbeat(info))

    async def unregister(self, instance_id: str) -> None:
        self._stop_heartbeat(instance_id)
        self._registry.leases.remove(instance_id, graceful=True)

    async def instances(self, endpoint: EndpointName | str) -> list[InstanceInfo]:
        return self._registry.leases.instances(str(EndpointName.of(endpoint)))

    def watch(self, endpoint: EndpointName | str | None = None) -> AsyncGenerator[DiscoveryEvent, None]:
        name = None if endpoint is None else str(EndpointName.of(endpoint))
        return self._registry.leases.watch(name, owner=self)

    def vouched(self) -> list[str]:
        return []  # one process: a silent instance is a dead one

    def abandon(self) -> None:
        """Stop heartbeating without unregistering: what a crashed process looks like."""
        for instance_id in list(self._heartbeats):
            self._stop_heartbeat(instance_id)

    async def close(self) -> None:
        for instance_id in list(self._heartbeats):
            await self.unregister(instance_id)
        self._registry.leases.end_watches(self)

    async def _heartbeat(self, info: InstanceInfo) -> None:
        while True:
            await asyncio.sleep(self._config.heartbeat_interval)
            self._registry.leases.refresh(info, self._config.lease_timeout)

    def _stop_heartbeat(self, instance_id: str) -> None:
        task = self._heartbeats.pop(instance_id, None)
        if task is not None:
            task.cancel()


class InProcRequestPlane:
    def __init__(self, registry: InProcRegistry) -> None:
        self._registry = registry
        self._keys: set[str] = set()
        self._calls: dict[asyncio.Task[None], Channel[Item]] = {}

    async def serve(
        self, endpoint: EndpointName | str, handler: Handler, *, instance_id: str | None = None
    ) -> str:
        key = EndpointName.of(endpoint).key(instance_id)
        self._registry.handlers[key] = (self, handler)
        self._keys.add(key)
        return SCHEME + key

    async def unserve(self, address: str) -> None:
        key = _key_of(address)
        self._keys.discard(key)
        entry = self._registry.handlers.get(key)
        if entry is not None and entry[0] is self:
            del self._registry.handlers[key]

    def stream(self, address: str, payload: bytes) -> AsyncGenerator[bytes, None]:
        async def open_call() -> Opened:
            entry = self._registry.handlers.get(_key_of(address))
            if entry is None:
                raise TransportError(f"no handler at {address}")
            server, handler = entry
            ctx = CallContext(key=_key_of(address), stream_id=next(self._registry.stream_ids))
            channel, task = server._start(handler, payload, ctx)
            return channel, task.cancel  # client gone: the handler sees CancelledError at once

        return drain(open_call)

    async def ping(self, address: str, timeout: float | None = None) -> float:
        if _key_of(address) not in self._registry.handlers:
            raise TransportError(f"no handler at {address}")
        return 0.0

    async def close(self) -> None:
        for key in list(self._keys):
            await self.unserve(SCHEME + key)
        for task, channel in list(self._calls.items()):
            task.cancel()
            channel.put(TransportError("server closed"))

    def _start(
        self, handler: Handler, payload: bytes, ctx: CallContext
    ) -> tuple[Channel[Item], asyncio.Task[None]]:
        channel = Channel[Item]()

        async def send(chunk: bytes) -> None:
            channel.put(chunk)

        async def end() -> None:
            channel.put(None)

        async def fail(code: str, message: str, param: str | None) -> None:
            channel.put(remote_error(code, message, param))

        task = asyncio.create_task(run_handler(handler, payload, ctx, send, end, fail))
        self._calls[task] = channel
        task.add_done_callback(self._calls.pop)
        return channel, task


class InProcEventPlane:
    def __init__(self, registry: InProcRegistry) -> None:
        self._registry = registry
        self._own = Subscriptions()

    async def publish(self, subject: str, payload: bytes) -> None:
        for sub in self._registry.subscriptions:
            if sub.subject == subject or subject_matches(sub.subject, subject):
                sub.deliver(subject, payload)

    async def subscribe(self, subject: str) -> Subscription:
        async def on_close() -> None:
            self._registry.subscriptions.remove(sub)

        sub = Subscription(subject, on_close)
        self._registry.subscriptions.append(sub)
        return self._own.add(sub)

    async def close(self) -> None:
        await self._own.close()


def _key_of(address: str) -> str:
    if not address.startswith(SCHEME):
        raise TransportError(f"not an in-process address: {address!r}")
    return address[len(SCHEME) :]
