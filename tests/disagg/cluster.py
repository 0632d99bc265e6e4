"""An in-process disaggregated deployment: workers (each with its own transfer agent) and a
router service with disaggregation on, all on one in-process runtime."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from interlock.engine.clock import RealClock
from interlock.engine.core import EngineCore
from interlock.engine.runners.mock import MockRunner
from interlock.engine.worker import Worker, WorkerOptions
from interlock.protocol import GenerateOutput, GenerateRequest, InstanceInfo, SamplingParams, subjects
from interlock.protocol.control import ControlReply, ControlRequest
from interlock.router.disagg import DisaggConfig
from interlock.router.disagg_flow import control_call
from interlock.router.facade import RouterConfig
from interlock.router.service import RouterService
from interlock.runtime import connect_runtime
from interlock.runtime.runtime import Runtime
from interlock.transfer import TransferAgent

MODEL = "m"


def mock_engine(*, num_blocks: int = 256, block_size: int = 4, chunk: int = 32,
                kv_hold_timeout_s: float = 30.0) -> EngineCore:
    """A mock engine on the real clock (KV hold timeouts fire), no modelled sleeping."""
    from tests.engine.conftest import EOS, VOCAB, make_config

    config = make_config(num_blocks=num_blocks, block_size=block_size, max_num_batched_tokens=chunk)
    runner = MockRunner(num_blocks=num_blocks, block_size=block_size, vocab_size=VOCAB,
                        eos_token_ids=(EOS,), timing=None)
    return EngineCore(config, runner, clock=RealClock(), kv_hold_timeout_s=kv_hold_timeout_s)


@dataclass
class Cluster:
    runtime: Runtime
    service: RouterService
    workers: dict[str, Worker] = field(default_factory=dict)
    agents: dict[str, TransferAgent] = field(default_factory=dict)

    async def add_worker(self, wid: str, role: str, core: EngineCore, *, agent: bool = True,
                         transfer_timeout_s: float = 30.0) -> Worker:
        info = InstanceInfo(instance_id=wid, endpoint=subjects.GENERATE_ENDPOINT, model=MODEL, role=role,
                            block_size=core.block_size, kv_blocks_total=core.pool.num_blocks)
        ta = TransferAgent() if agent else None
        w = Worker(core, info, discovery=self.runtime.discovery, requests=self.runtime.requests,
                   events=self.runtime.events, transfer=ta,
                   options=WorkerOptions(kv_transfer_timeout_s=transfer_timeout_s))
        await w.start()
        self.workers[wid] = w
        if ta is not None:
            self.agents[wid] = ta
        return w

    async def wait_for(self, n: int) -> None:
        assert await self.service.wait_for_workers(n, 5.0) == n

    async def generate(self, rid: str, prompt: list[int], max_tokens: int) -> list[GenerateOutput]:
        req = GenerateRequest(request_id=rid, token_ids=tuple(prompt), model=MODEL,
                              sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0))
        stream = self.service.generate(req)
        async with contextlib.aclosing(stream):
            return [out async for out in stream]

    async def control(self, wid: str, req: ControlRequest) -> ControlReply:
        addr = self.workers[wid].info.metadata["control_address"]
        return await control_call(self.runtime.requests, addr, req)

    async def kill(self, wid: str) -> None:
        """Close a worker abruptly (no drain): its streams end, its agent goes."""
        w = self.workers.pop(wid)
        await self.runtime.discovery.unregister(wid)
        await w.close()
        agent = self.agents.pop(wid, None)
        if agent is not None:
            agent.close()


def tokens(outs: list[GenerateOutput]) -> list[int]:
    return [t for o in outs for t in o.token_ids]


@contextlib.asynccontextmanager
async def cluster(config: DisaggConfig | None = None, *, block_size: int = 4) -> AsyncIterator[Cluster]:
    runtime = await connect_runtime(None)
    service = RouterService(discovery=runtime.discovery, requests=runtime.requests, events=runtime.events,
                            config=RouterConfig(block_size=block_size),
                            disagg=config or DisaggConfig(enforce=True))
    await service.start()
    c = Cluster(runtime, service)
    try:
        yield c
    finally:
        for w in list(c.workers.values()):
            await w.close()
        for a in c.agents.values():
            a.close()
        await service.close()
        await runtime.close()


async def eventually(cond: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)
