"""Fixtures: one real nats-server per session; runtimes of every implementation per test."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import replace

import pytest

from interlock.runtime import InProcRegistry, NatsServer, Runtime, RuntimeConfig, connect_runtime

FAST = RuntimeConfig(
    heartbeat_interval=0.1,
    lease_timeout=0.5,
    connect_timeout=1.0,
    peer_timeout=1.0,
    discovery_sync_s=0.05,
)
"""Short leases and timeouts so expiry tests take well under a second."""

IMPLEMENTATIONS = ["inproc", "nats+tcp", "nats+nats"]

MakeRuntime = Callable[[], Awaitable[Runtime]]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def nats_server() -> Iterator[NatsServer]:
    with NatsServer() as server:
        yield server


@pytest.fixture
def namespace() -> str:
    """A namespace unique to the test, so tests sharing the NATS server never see each other."""
    return "t" + uuid.uuid4().hex[:12]


@pytest.fixture(params=IMPLEMENTATIONS)
async def make_runtime(request: pytest.FixtureRequest, anyio_backend: str) -> AsyncIterator[MakeRuntime]:
    """Factory of runtimes that share one plane (one registry, or one NATS server)."""
    impl: str = request.param
    registry = InProcRegistry()
    made: list[Runtime] = []

    async def make() -> Runtime:
        if impl == "inproc":
            runtime = await connect_runtime(None, FAST, registry=registry)
        else:
            server: NatsServer = request.getfixturevalue("nats_server")
            config = replace(FAST, request_plane=impl.split("+")[1])  # type: ignore[arg-type]
            runtime = await connect_runtime(server.url, config)
        made.append(runtime)
        return runtime

    yield make
    for runtime in made:
        await runtime.close()
    registry.leases.close()
