"""Request-plane behaviour, the same for every implementation (see conftest.make_runtime)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing

import anyio
import pytest

from interlock.errors import NoWorkers, PromptTooLong, TransportError
from interlock.runtime import CallContext, Runtime

from .conftest import MakeRuntime

pytestmark = pytest.mark.anyio


async def echo(payload: bytes, ctx: CallContext) -> AsyncIterator[bytes]:
    for i in range(int(payload)):
        yield str(i).encode()


class Endless:
    """A handler that streams until cancelled and records that its cleanup ran."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()

    async def __call__(self, payload: bytes, ctx: CallContext) -> AsyncIterator[bytes]:
        self.started.set()
        try:
            while True:
                yield b"tok"
                await asyncio.sleep(0.005)
        finally:
            self.cancelled.set()


async def pair(make_runtime: MakeRuntime) -> tuple[Runtime, Runtime]:
    return await make_runtime(), await make_runtime()


async def collect(runtime: Runtime, address: str, payload: bytes) -> list[bytes]:
    with anyio.fail_after(5):
        return [chunk async for chunk in runtime.requests.stream(address, payload)]


async def test_stream_round_trip(make_runtime: MakeRuntime, namespace: str) -> None:
    server, client = await pair(make_runtime)
    address = await server.requests.serve(f"{namespace}.worker.generate", echo, instance_id="w1")
    assert await collect(client, address, b"3") == [b"0", b"1", b"2"]
    assert await collect(client, address, b"0") == []


async def test_concurrent_streams_do_not_mix(make_runtime: MakeRuntime, namespace: str) -> None:
    server, client = await pair(make_runtime)

    async def tagged(payload: bytes, ctx: CallContext) -> AsyncIterator[bytes]:
        for i in range(20):
            await asyncio.sleep(0)
            yield payload + b":%d" % i

    address = await server.requests.serve(f"{namespace}.worker.generate", tagged)
    results = await asyncio.gather(*(collect(client, address, b"%d" % n) for n in range(32)))
    for n, chunks in enumerate(results):
        assert chunks == [b"%d:%d" % (n, i) for i in range(20)]


async def test_client_close_cancels_handler(make_runtime: MakeRuntime, namespace: str) -> None:
    server, client = await pair(make_runtime)
    handler = Endless()
    address = await server.requests.serve(f"{namespace}.worker.generate", handler)
    async with aclosing(client.requests.stream(address, b"")) as chunks:
        assert await anext(chunks) == b"tok"
    with anyio.fail_after(1):
        await handler.cancelled.wait()


async def test_client_task_cancel_cancels_handler(make_runtime: MakeRuntime, namespace: str) -> None:
    server, client = await pair(make_runtime)
    handler = Endless()
    address = await server.requests.serve(f"{namespace}.worker.generate", handler)

    async def consume() -> None:
        async with aclosing(client.requests.stream(address, b"")) as chunks:
            async for _ in chunks:
                pass

    task = asyncio.create_task(consume())
    with anyio.fail_after(2):
        await handler.started.wait()
    task.cancel()
    with anyio.fail_after(1):
        await handler.cancelled.wait()


async def test_handler_failure_is_a_transport_error(make_runtime: MakeRuntime, namespace: str) -> None:
    server, client = await pair(make_runtime)

    async def broken(payload: bytes, ctx: CallContext) -> AsyncIterator[bytes]:
        yield b"first"
        raise ValueError("boom")

    address = await server.requests.serve(f"{namespace}.worker.generate", broken)
    received = []
    with pytest.raises(TransportError, match="boom"):
        async for chunk in client.requests.stream(address, b""):
            received.append(chunk)
    assert received == [b"first"]


async def test_interlock_errors_keep_their_class(make_runtime: MakeRuntime, namespace: str) -> None:
    server, client = await pair(make_runtime)

    async def too_long(payload: bytes, ctx: CallContext) -> AsyncIterator[bytes]:
        raise PromptTooLong("prompt has 9000 tokens, limit 2048", param="messages")
        yield b""

    async def no_workers(payload: bytes, ctx: CallContext) -> AsyncIterator[bytes]:
        raise NoWorkers("none")  # a constructor with other keywords (retry_after)
        yield b""

    address = await server.requests.serve(f"{namespace}.worker.generate", too_long)
    with pytest.raises(PromptTooLong, match="limit 2048") as caught:
        await collect(client, address, b"")
    assert caught.value.param == "messages"  # on every plane: the field the error is about
    address = await server.requests.serve(f"{namespace}.worker.other", no_workers)
    with pytest.raises(NoWorkers, match="none"):
        await collect(client, address, b"")


async def test_missing_and_unserved_handlers_fail_fast(make_runtime: MakeRuntime, namespace: str) -> None:
    server, client = await pair(make_runtime)
    address = await server.requests.serve(f"{namespace}.worker.generate", echo)
    await server.requests.unserve(address)
    # No hang: each call ends at once, or at worst by the peer timeout (1 s here) when
    # nats-server drops the no-responders reply to a just-made inbox (a known quirk, ~1 in 100).
    with anyio.fail_after(3.0):
        with pytest.raises(TransportError):
            await collect(client, address, b"1")
        with pytest.raises(TransportError):
            await client.requests.ping(address)


async def test_ping(make_runtime: MakeRuntime, namespace: str) -> None:
    server, client = await pair(make_runtime)
    address = await server.requests.serve(f"{namespace}.worker.health", echo, instance_id="w1")
    assert 0 <= await client.requests.ping(address) < 1


async def test_server_close_fails_calls_in_flight(make_runtime: MakeRuntime, namespace: str) -> None:
    server, client = await pair(make_runtime)
    handler = Endless()
    address = await server.requests.serve(f"{namespace}.worker.generate", handler)
    with anyio.fail_after(0.9):
        with pytest.raises(TransportError):
            async for _ in client.requests.stream(address, b""):
                if not handler.cancelled.is_set():
                    await server.requests.close()
    with anyio.fail_after(1):
        await handler.cancelled.wait()


async def test_a_plane_that_called_first_still_serves_cancellably(
    make_runtime: MakeRuntime, namespace: str
) -> None:
    a, b = await pair(make_runtime)
    echo_address = await b.requests.serve(f"{namespace}.worker.echo", echo)
    assert await collect(a, echo_address, b"1") == [b"0"]  # a is a client first
    handler = Endless()
    address = await a.requests.serve(f"{namespace}.worker.generate", handler)
    async with aclosing(b.requests.stream(address, b"")) as chunks:
        assert await anext(chunks) == b"tok"
    with anyio.fail_after(1):
        await handler.cancelled.wait()
