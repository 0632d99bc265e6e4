"""A worker's drain, over a real nats-server and the TCP request plane, with the real router
service and its dispatcher (mock engines on the real clock, each worker on its own runtime).

A drained worker (or one changing role) leaves discovery at once, so new requests go elsewhere,
but the streams it is serving finish on it: no migration. Only when its grace runs out (it aborts them) or it dies
during the drain do they move, and then they continue with exactly the tokens they would have
had (the mock model's next token is a hash of the KV it reads back)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import pytest

from interlock.engine.worker import Worker
from interlock.protocol import GenerateOutput, GenerateRequest, SamplingParams
from interlock.protocol.routing import RequestContext
from interlock.router.dispatcher import EXPLAIN_HEADER
from interlock.router.model_router import RouterConfig
from interlock.router.service import RouterService
from interlock.runtime import NatsServer, RuntimeConfig, connect_runtime
from interlock.runtime.runtime import Runtime
from tests.engine.conftest import timed_worker

MODEL = "m"
BLOCK = 4
CFG = RuntimeConfig(heartbeat_interval=0.1, lease_timeout=1.0, discovery_sync_s=0.05)


@pytest.fixture(scope="module")
def nats() -> Iterator[NatsServer]:
    with NatsServer() as server:
        yield server


class Cluster:
    """A router service and workers, each on its own runtime over one nats-server."""

    def __init__(self, url: str, service: RouterService) -> None:
        self.url = url
        self.service = service
        self.workers: dict[str, tuple[Worker, Runtime]] = {}

    async def add(self, wid: str, speedup: float = 20.0) -> Worker:
        runtime = await connect_runtime(self.url, CFG)
        worker = timed_worker(wid, runtime, speedup=speedup, model=MODEL, block_size=BLOCK)
        await worker.start()
        self.workers[wid] = (worker, runtime)
        assert await self.service.wait_for_workers(len(self.workers), 10.0) == len(self.workers)
        return worker

    async def gone(self, wid: str) -> None:
        """Until the router no longer lists ``wid``."""
        async with asyncio.timeout(10):
            while self.service.instance(wid) is not None:
                await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def cluster(nats: NatsServer) -> AsyncIterator[Cluster]:
    runtime = await connect_runtime(nats.url, CFG)
    service = RouterService(
        discovery=runtime.discovery,
        requests=runtime.requests,
        events=runtime.events,
        config=RouterConfig(block_size=BLOCK),
    )
    await service.start()
    c = Cluster(nats.url, service)
    try:
        yield c
    finally:
        for worker, wrt in c.workers.values():
            with contextlib.suppress(Exception):
                await worker.close()
            await wrt.close()
        await service.close()
        await runtime.close()


def request(rid: str, max_tokens: int) -> GenerateRequest:
    return GenerateRequest(
        request_id=rid,
        token_ids=tuple(range(10, 31)),
        model=MODEL,
        sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
    )


async def collect(
    c: Cluster,
    req: GenerateRequest,
    *,
    pin: str | None = None,
    after: int = 0,
    action: Callable[[], Awaitable[None]] | None = None,
) -> tuple[list[int], str, str | None]:
    """Stream ``req`` (``action`` once ``after`` tokens are in): its tokens, the worker it was
    first routed to, its finish reason."""
    ctx = RequestContext(request_id=req.request_id, endpoint="completions", worker_id=pin, explain=True)
    tokens: list[int] = []
    last: GenerateOutput | None = None
    stream = c.service.generate(req, ctx)
    async with asyncio.timeout(30), contextlib.aclosing(stream):
        async for out in stream:
            tokens += out.token_ids
            last = out
            if action is not None and len(tokens) >= after:
                await action()
                action = None
    worker = ctx.response_headers[EXPLAIN_HEADER].split(";")[0].split("=")[-1]
    return tokens, worker, last.finish_reason if last else None


@pytest.mark.timeout(60)
def test_a_draining_worker_finishes_its_streams_and_new_requests_go_elsewhere(nats: NatsServer) -> None:
    async def main() -> None:
        async with cluster(nats) as c:
            a = await c.add("a", speedup=1.0)  # ~7 ms steps: 200 tokens take ~1.4 s
            await c.add("b")
            reference, _, _ = await collect(c, request("ref", 200), pin="b")
            drained: list[asyncio.Task[None]] = []
            during: list[tuple[list[int], str, str | None]] = []

            async def drain() -> None:
                drained.append(asyncio.create_task(a.drain(grace_s=30.0)))
                await c.gone("a")
                assert a.in_flight == 1  # ours, still streaming on a
                during.append(await collect(c, request("new", 8)))

            tokens, worker, finish = await collect(c, request("r", 200), pin="a", after=5, action=drain)
            assert worker == "a" and tokens == reference and finish == "length"
            m = c.service.dispatcher.metrics
            assert (m.migrations, m.worker_aborts, m.retries, m.stalls) == (0, 0, 0, 0)
            [(new_tokens, new_worker, new_finish)] = during
            assert new_worker == "b" and len(new_tokens) == 8 and new_finish == "length"
            async with asyncio.timeout(10):
                await drained[0]  # over as soon as its last stream ended, long before the grace
            assert a.in_flight == 0

    asyncio.run(main())


@pytest.mark.timeout(60)
@pytest.mark.parametrize("ending", ["grace over", "dies while draining"])
def test_a_draining_worker_s_streams_move_only_when_it_aborts_or_dies(nats: NatsServer, ending: str) -> None:
    async def main() -> None:
        async with cluster(nats) as c:
            a = await c.add("a", speedup=1.0)
            await c.add("b")
            reference, _, _ = await collect(c, request("ref", 200), pin="b")

            async def drain() -> None:
                if ending == "grace over":
                    asyncio.create_task(a.drain(grace_s=0.3))
                    return
                drain = asyncio.create_task(a.drain(grace_s=30.0))
                await c.gone("a")
                await asyncio.sleep(0.1)
                assert c.service.dispatcher.metrics.migrations == 0  # still on a
                drain.cancel()
                _, runtime = c.workers["a"]
                await runtime.requests.close()  # its connections drop: what a SIGKILL looks like

            tokens, worker, finish = await collect(c, request("r", 200), pin="a", after=5, action=drain)
            assert worker == "a" and tokens == reference and finish == "length"
            m = c.service.dispatcher.metrics
            assert m.migrations == 1 and m.migrations_exhausted == 0
            assert m.worker_aborts == (1 if ending == "grace over" else 0)

    asyncio.run(main())


@pytest.mark.timeout(60)
def test_a_role_change_lets_the_worker_finish_its_streams_first(nats: NatsServer) -> None:
    """``set_role`` leaves discovery the same way (the planner's re-role, the control call)."""

    async def main() -> None:
        async with cluster(nats) as c:
            a = await c.add("a", speedup=1.0)
            await c.add("b")
            reference, _, _ = await collect(c, request("ref", 200), pin="b")
            changed: list[asyncio.Task[None]] = []

            async def re_role() -> None:
                changed.append(asyncio.create_task(a.set_role("prefill", grace_s=30.0)))
                await c.gone("a")

            tokens, worker, finish = await collect(c, request("r", 200), pin="a", after=5, action=re_role)
            assert worker == "a" and tokens == reference and finish == "length"
            assert c.service.dispatcher.metrics.migrations == 0
            async with asyncio.timeout(10):
                await changed[0]
                while (info := c.service.instance("a")) is None or info.role != "prefill":
                    await asyncio.sleep(0.01)

    asyncio.run(main())
