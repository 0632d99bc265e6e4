"""Event-plane behaviour, the same for every implementation (see conftest.make_runtime)."""

from __future__ import annotations

import anyio
import pytest

from interlock.runtime import EndpointName, Runtime, Subscription

from .conftest import MakeRuntime

pytestmark = pytest.mark.anyio


PROBE = b"probe"


async def take(sub: Subscription, n: int) -> list[tuple[str, bytes]]:
    taken: list[tuple[str, bytes]] = []
    with anyio.fail_after(2):
        while len(taken) < n:
            if (item := await anext(sub))[1] != PROBE:
                taken.append(item)
    return taken


async def until_delivered(publisher: Runtime, sub: Subscription, subject: str) -> None:
    """Publish probes until one arrives. nats-server can drop what another connection publishes
    in the first moments after a subscription, even after a flush (seen in ~2% of fresh
    subscriptions here); long-lived subscribers never notice, a test does."""
    with anyio.fail_after(2):
        while True:
            await publisher.events.publish(subject, PROBE)
            with anyio.move_on_after(0.05):
                while (await anext(sub))[1] != PROBE:
                    pass
                return


async def test_publish_reaches_exact_and_wildcard_subscribers(
    make_runtime: MakeRuntime, namespace: str
) -> None:
    worker, router = await make_runtime(), await make_runtime()
    name = EndpointName(namespace, "worker", "generate")
    exact = await router.events.subscribe(name.subject("kv", "w1"))
    any_worker = await router.events.subscribe(name.subject("kv", "*"))
    everything = await router.events.subscribe(name.subject(">"))
    await until_delivered(worker, exact, name.subject("kv", "w1"))
    await until_delivered(worker, any_worker, name.subject("kv", "w2"))
    await until_delivered(worker, everything, name.subject("x"))
    await worker.events.publish(name.subject("kv", "w1"), b"a")
    await worker.events.publish(name.subject("kv", "w2"), b"b")
    await worker.events.publish(name.subject("load", "w1"), b"c")
    assert await take(exact, 1) == [(name.subject("kv", "w1"), b"a")]
    assert await take(any_worker, 2) == [(name.subject("kv", "w1"), b"a"), (name.subject("kv", "w2"), b"b")]
    assert [payload for _, payload in await take(everything, 3)] == [b"a", b"b", b"c"]


async def test_order_is_kept_per_publisher(make_runtime: MakeRuntime, namespace: str) -> None:
    worker, router = await make_runtime(), await make_runtime()
    subject = EndpointName(namespace, "worker", "generate").subject("kv", "w1")
    sub = await router.events.subscribe(subject)
    await until_delivered(worker, sub, subject)
    for i in range(200):
        await worker.events.publish(subject, b"%d" % i)
    assert [payload for _, payload in await take(sub, 200)] == [b"%d" % i for i in range(200)]


async def test_close_ends_iteration_and_delivery(make_runtime: MakeRuntime, namespace: str) -> None:
    worker, router = await make_runtime(), await make_runtime()
    subject = EndpointName(namespace, "worker", "generate").subject("load", "w1")
    async with await router.events.subscribe(subject) as sub:
        await until_delivered(worker, sub, subject)
        await worker.events.publish(subject, b"x")
        assert await take(sub, 1) == [(subject, b"x")]
    await worker.events.publish(subject, b"y")
    with anyio.fail_after(1):
        assert [item async for item in sub] == []


async def test_a_closed_subscription_is_not_kept_by_its_plane(make_runtime: MakeRuntime) -> None:
    rt = await make_runtime()
    own = rt.events._own  # type: ignore[attr-defined]
    for i in range(50):  # a shard follows each worker that joins and forgets each that leaves
        sub = await rt.events.subscribe(f"t.churn.{i}")
        await sub.close()
    kept = await rt.events.subscribe("t.churn.kept")
    assert len(own) == 1
    await rt.events.close()
    assert len(own) == 0 and kept._closed
