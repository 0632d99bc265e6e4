"""An in-process disaggregated deployment, built by ``interlock.cluster``'s builder: in-process
planes, the router service as ``serve`` builds it, and workers (each with its own transfer
agent) around hand-made mock engines."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from interlock.cluster.builder import RunningCluster, start_cluster
from interlock.cluster.spec import ClusterSpec, ProcessOptions
from interlock.cluster.worker import WorkerSpec
from interlock.deploy import Deployment, Routing
from interlock.engine.clock import RealClock
from interlock.engine.core import EngineCore
from interlock.engine.runners.mock import MockRunner
from interlock.engine.worker import Worker
from interlock.protocol import GenerateOutput, GenerateRequest, SamplingParams
from interlock.protocol.control import ControlReply, ControlRequest
from interlock.router.service import RouterService
from interlock.router.worker_control import control_call
from interlock.transfer import TransferAgent

MODEL = "m"
ENFORCED = Routing(enforce_disagg=True)


def mock_engine(
    *,
    num_blocks: int = 256,
    block_size: int = 4,
    chunk: int = 32,
    kv_hold_timeout_s: float = 30.0,
    shared: bool = False,
    runner_class: type[MockRunner] = MockRunner,
) -> EngineCore:
    """A mock engine on the real clock (KV hold timeouts fire), no modelled sleeping;
    ``shared``: its KV on a memfd (the one copy)."""
    from tests.engine.conftest import EOS, VOCAB, make_config

    config = make_config(num_blocks=num_blocks, block_size=block_size, max_num_batched_tokens=chunk)
    runner = runner_class(
        num_blocks=num_blocks,
        block_size=block_size,
        vocab_size=VOCAB,
        eos_token_ids=(EOS,),
        timing=None,
        shared=shared,
    )
    return EngineCore(config, runner, clock=RealClock(), kv_hold_timeout_s=kv_hold_timeout_s)


@dataclass
class Cluster:
    running: RunningCluster

    @property
    def service(self) -> RouterService:
        return self.running.service  # type: ignore[no-any-return]

    @property
    def workers(self) -> dict[str, Worker]:
        return {w.instance_id: w.local for w in self.running.workers()}

    @property
    def agents(self) -> dict[str, TransferAgent]:
        return {wid: w.handoff.agent for wid, w in self.workers.items() if w.handoff is not None}

    async def add_worker(
        self,
        wid: str,
        role: str,
        core: EngineCore,
        *,
        agent: bool = True,
        transfer_timeout_s: float = 30.0,
        transport: str = "auto",
    ) -> Worker:
        spec = WorkerSpec(
            engine=core.config,
            served_name=MODEL,
            model_path="",
            role=role,
            instance_id=wid,
            kv_transfer=transport if agent else "none",
            kv_transfer_timeout_s=transfer_timeout_s,
        )
        return (await self.running.launch(spec, core=core)).local  # type: ignore[no-any-return]

    async def wait_for(self, n: int) -> None:
        assert await self.service.wait_for_workers(n, 5.0) == n

    async def generate(self, rid: str, prompt: list[int], max_tokens: int) -> list[GenerateOutput]:
        req = GenerateRequest(
            request_id=rid,
            token_ids=tuple(prompt),
            model=MODEL,
            sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0),
        )
        stream = self.service.generate(req)
        async with contextlib.aclosing(stream):
            return [out async for out in stream]

    async def control(self, wid: str, req: ControlRequest) -> ControlReply:
        addr = self.workers[wid].info.metadata["control_address"]
        return await control_call(self.running.runtime.requests, addr, req)

    async def kill(self, wid: str) -> None:
        """Close a worker abruptly (no drain): its streams end, its agent goes."""
        handle = next(w for w in self.running.workers() if w.instance_id == wid)
        await self.running.remove_worker(handle, drain=False)


def tokens(outs: list[GenerateOutput]) -> list[int]:
    return [t for o in outs for t in o.token_ids]


@contextlib.asynccontextmanager
async def cluster(routing: Routing = ENFORCED) -> AsyncIterator[Cluster]:
    spec = ClusterSpec(
        deployment=Deployment(routing=routing, execution_groups=()),
        frontend=None,
        start_workers=False,
        processes=ProcessOptions(in_process=True, drain_grace_s=0.0),
    )
    running = await start_cluster(spec)
    try:
        yield Cluster(running)
    finally:
        await running.close()


async def eventually(cond: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)
