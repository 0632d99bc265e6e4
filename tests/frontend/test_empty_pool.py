"""Scale to zero over HTTP: a model the deployment declares (``RouterService.expect_model``) is
listed and healthy with no worker; a completion for it waits for the first worker and is
served; a client that gives up while waiting leaves no waiter behind (the frontend cancels its
handler, and the wait with it).

The frontend over a real ``RouterService`` on in-process planes, and a timed mock worker."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from interlock.engine.worker import Worker
from interlock.frontend import serve_frontend
from interlock.protocol import InstanceInfo, subjects
from interlock.protocol.routing import ModelEntry
from interlock.router.model_router import RouterConfig
from interlock.router.service import RouterService
from interlock.runtime import InProcRegistry, connect_runtime
from tests.engine.conftest import timed_engine

MODEL = "smol"
BODY = {"model": MODEL, "prompt": [11, 12, 13, 14, 15], "max_tokens": 5, "ignore_eos": True}
"""Token ids: the mock engine's vocabulary is 1000 tokens."""


async def until(cond: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


def test_a_completion_at_an_empty_pool_waits_for_the_first_worker(smol_path: Path) -> None:
    async def main() -> None:
        registry = InProcRegistry()
        runtime = await connect_runtime(None, registry=registry)
        svc = RouterService(
            discovery=runtime.discovery,
            requests=runtime.requests,
            events=runtime.events,
            config=RouterConfig(block_size=4),
        )
        await svc.start()
        svc.expect_model(ModelEntry(MODEL, str(smol_path), 2048), on_demand=True)
        server = await serve_frontend(svc, "127.0.0.1", 0)
        worker: Worker | None = None
        try:
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
                assert [m["id"] for m in (await c.get("/v1/models")).json()["data"]] == [MODEL]
                assert (await c.get("/health")).status_code == 200

                async with httpx.AsyncClient(base_url=server.url) as impatient:
                    gives_up = asyncio.create_task(impatient.post("/v1/completions", json=BODY, timeout=1.0))
                    await until(lambda: svc.waiting_for_worker(MODEL) == 1)
                    with pytest.raises(httpx.ReadTimeout):
                        await gives_up
                await until(lambda: svc.waiting_for_worker() == 0)

                pending = asyncio.create_task(c.post("/v1/completions", json=BODY))
                await until(lambda: svc.waiting_for_worker(MODEL) == 1)
                info = InstanceInfo(
                    instance_id="w0",
                    endpoint=subjects.GENERATE_ENDPOINT,
                    model=MODEL,
                    model_path=str(smol_path),
                    block_size=4,
                    kv_blocks_total=256,
                )
                worker = Worker(
                    timed_engine(),
                    info,
                    discovery=runtime.discovery,
                    requests=runtime.requests,
                    events=runtime.events,
                )
                await worker.start()
                r = await asyncio.wait_for(pending, 10)
                assert r.status_code == 200, r.text
                assert r.json()["usage"]["completion_tokens"] == 5
                assert svc.waiting_for_worker() == 0
        finally:
            await server.close()
            if worker is not None:
                await worker.close()
            await svc.close()
            await runtime.close()
            registry.leases.close()

    asyncio.run(main())
