"""Scale to zero, the router's side: a request for a model served on demand (a planner with min 0
starts its workers) with no worker right now waits for one (counted for the planner, bounded in
number and time, gone from the count when its client leaves) and is served once a worker
registers; nothing fails because the pool was empty. A model not served on demand still
answers 503 at once: nobody would start a worker for it.

In-process planes and timed mock workers (``tests/router/test_dispatcher.py``'s fleet)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from interlock.errors import ConfigError, ModelNotFound, NoWorkers, Overloaded
from interlock.planner.live import RouterServiceView
from interlock.protocol import GenerateRequest
from interlock.protocol.routing import ModelEntry, RequestContext
from interlock.router.dispatcher import DispatchOptions
from interlock.router.model_router import RouterConfig
from tests.router.test_dispatcher import BLOCK, MODEL, Fleet, fleet, request

ENTRY = ModelEntry(MODEL, "/models/m", 2048)


async def tokens(f: Fleet, req: GenerateRequest) -> int:
    """Stream ``req`` to its end; how many tokens came."""
    got = 0
    stream = f.service.generate(req, RequestContext(request_id=req.request_id, endpoint="completions"))
    async with contextlib.aclosing(stream):
        async for out in stream:
            got += len(out.token_ids)
    return got


async def waiting(f: Fleet, n: int, timeout_s: float = 5.0) -> None:
    """Until ``n`` requests wait for a worker of the model."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while f.service.waiting_for_worker(MODEL) != n:
        assert asyncio.get_running_loop().time() < deadline, f.service.waiting_for_worker(MODEL)
        await asyncio.sleep(0.01)


def test_a_request_at_a_model_never_served_waits_is_counted_and_is_served_by_the_first_worker() -> None:
    async def body() -> None:
        async with fleet() as f:
            svc = f.service
            svc.expect_model(ENTRY, on_demand=True)
            assert svc.models() == [ENTRY] and svc.health() == []  # scaled to zero is healthy
            task = asyncio.create_task(tokens(f, request("a", max_tokens=12)))
            await waiting(f, 1)
            assert RouterServiceView(svc).queued() == 1  # the planner's router_queue: it wakes
            assert RouterServiceView(svc, model=MODEL).queued() == 1
            assert RouterServiceView(svc, model="other").queued() == 0
            assert f'interlock_router_waiting_for_worker{{model="{MODEL}"}} 1' in svc.prometheus_text()
            assert not task.done()
            await f.add("w0")
            assert await asyncio.wait_for(task, 10) == 12
            assert svc.waiting_for_worker() == 0 and RouterServiceView(svc).queued() == 0
            assert svc.models()[0].model_path == ""  # the live worker's card, not the declared one

    asyncio.run(body())


def test_a_model_whose_workers_all_left_serves_its_next_request_from_the_next_worker() -> None:
    async def body() -> None:
        async with fleet() as f:
            await f.add("w0")
            await f.kill("w0")
            assert MODEL not in f.service.routers and f.service.health() != []
            with pytest.raises(NoWorkers, match="no worker is serving 'm' right now"):
                f.service.generate(request("now"), None)  # not on demand: 503 at once
            f.service.expect_model(ENTRY, on_demand=True)
            assert f.service.health() == [] and f.service.models()[0].model_path == ""  # its last card
            task = asyncio.create_task(tokens(f, request("a", max_tokens=8)))
            await waiting(f, 1)
            await f.add("w1")
            assert await asyncio.wait_for(task, 10) == 8
            assert f.service.waiting_for_worker() == 0

    asyncio.run(body())


def test_past_the_queue_capacity_a_request_at_an_empty_pool_is_refused_overloaded() -> None:
    async def body() -> None:
        async with fleet(config=RouterConfig(block_size=BLOCK, queue_capacity=2)) as f:
            f.service.expect_model(ENTRY, on_demand=True)
            tasks = [asyncio.create_task(tokens(f, request(f"r{i}", max_tokens=4))) for i in range(2)]
            await waiting(f, 2)
            with pytest.raises(
                Overloaded, match=r"no worker serves 'm' yet and 2 requests already wait"
            ) as exc:
                await tokens(f, request("r2"))
            assert exc.value.status == 503 and exc.value.retry_after == 1.0
            assert f.service.waiting_for_worker(MODEL) == 2  # the refused one never counted
            await f.add("w0")
            assert await asyncio.wait_for(asyncio.gather(*tasks), 10) == [4, 4]

    asyncio.run(body())


def test_a_request_whose_wait_runs_out_gets_a_clear_503_and_leaves_the_count() -> None:
    async def body() -> None:
        async with fleet(DispatchOptions(queue_timeout_s=0.2)) as f:
            f.service.expect_model(ENTRY, on_demand=True)
            started = asyncio.get_running_loop().time()
            with pytest.raises(NoWorkers, match=r"no worker is serving 'm': none came within 0.2 s") as exc:
                await tokens(f, request("a"))
            assert asyncio.get_running_loop().time() - started >= 0.2
            assert exc.value.status == 503 and exc.value.retry_after == 1.0
            assert f.service.waiting_for_worker() == 0

    asyncio.run(body())


def test_a_client_that_leaves_while_waiting_leaves_nothing_behind() -> None:
    async def body() -> None:
        async with fleet() as f:
            f.service.expect_model(ENTRY, on_demand=True)
            task = asyncio.create_task(tokens(f, request("gone")))
            await waiting(f, 1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert f.service.waiting_for_worker() == 0 and RouterServiceView(f.service).queued() == 0
            await f.add("w0")
            router = f.service.routers[MODEL]
            assert len(router.queue) == 0 and not router.load.is_inflight("gone")
            assert router.metrics.requests == 0  # it was never routed

    asyncio.run(body())


def test_requests_queued_when_the_pool_empties_wait_for_the_next_worker_and_finish() -> None:
    """One request streams on the only worker and another waits in its queue when that worker
    dies: the first migrates, the second waits again, both for the next worker."""

    async def body() -> None:
        async with fleet(config=RouterConfig(block_size=BLOCK, max_inflight_per_worker=1)) as f:
            f.service.expect_model(ENTRY, on_demand=True)
            await f.add("w0", speedup=2.0)
            first = asyncio.create_task(tokens(f, request("a", max_tokens=40)))
            while not f.service.routers[MODEL].load.is_inflight("a"):
                await asyncio.sleep(0.01)
            queued = asyncio.create_task(tokens(f, request("b", max_tokens=6)))
            while len(f.service.routers[MODEL].queue) != 1:
                await asyncio.sleep(0.01)
            await f.kill("w0")
            await waiting(f, 2)
            assert not first.done() and not queued.done()
            await f.add("w1")
            assert await asyncio.wait_for(asyncio.gather(first, queued), 15) == [40, 6]
            assert f.service.dispatcher.metrics.migrations == 1

    asyncio.run(body())


def test_closing_the_service_answers_its_waiting_requests() -> None:
    async def body() -> None:
        async with fleet() as f:
            f.service.expect_model(ENTRY, on_demand=True)
            task = asyncio.create_task(tokens(f, request("a")))
            await waiting(f, 1)
            await f.service.close()
            with pytest.raises(NoWorkers, match="router shutting down"):
                await asyncio.wait_for(task, 5)
            assert f.service.waiting_for_worker() == 0

    asyncio.run(body())


def test_a_declared_model_not_on_demand_503s_at_once_and_an_unknown_one_404s() -> None:
    async def body() -> None:
        async with fleet() as f:
            with pytest.raises(ModelNotFound):
                f.service.generate(request("a"), None)
            f.service.expect_model(ENTRY)
            assert f.service.models() == [ENTRY] and f.service.health() == ["model 'm' has no live worker"]
            with pytest.raises(NoWorkers, match="no worker is serving 'm' right now"):
                f.service.generate(request("a"), None)
            assert f.service.waiting_for_worker() == 0

    asyncio.run(body())


def test_a_bad_declaration_is_an_error() -> None:
    async def body() -> None:
        async with fleet() as f:
            for bad in (ModelEntry("", "/p", 8), ModelEntry("x", "", 8), ModelEntry("x", "/p", 0)):
                with pytest.raises(ConfigError, match="expect_model"):
                    f.service.expect_model(bad)
            assert f.service.models() == []

    asyncio.run(body())
