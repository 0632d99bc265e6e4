"""Small engines on the mock runner and a virtual clock (or the real one: ``timed_engine``),
built per test (they are cheap)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest

from interlock.engine.clock import RealClock, VirtualClock
from interlock.engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from interlock.engine.core import EngineCore
from interlock.engine.runner import RunnerOutput, SchedulerOutput
from interlock.engine.runners.mock import MockRunner
from interlock.engine.timing import TimingModel
from interlock.engine.worker import Worker
from interlock.protocol import GenerateOutput, GenerateRequest, InstanceInfo, SamplingParams, subjects
from interlock.runtime.runtime import Runtime
from interlock.transfer import TransferAgent

VOCAB = 1000
EOS = 2


@dataclass
class Recorder:
    """Wraps a runner (mock or real) and keeps what the scheduler asked of it."""

    runner: Any
    batches: list[SchedulerOutput] = field(default_factory=list)

    def __getattr__(self, name: str) -> object:
        return getattr(self.runner, name)

    def execute(self, batch: SchedulerOutput) -> RunnerOutput:
        self.batches.append(batch)
        return self.runner.execute(batch)


def make_config(
    *,
    num_blocks: int = 64,
    block_size: int = 4,
    max_num_batched_tokens: int = 64,
    max_num_seqs: int = 16,
    max_model_len: int = 256,
    watermark: float = 0.0,
    prefix_caching: bool = True,
    chunked: bool = True,
    preempt: bool = False,
) -> EngineConfig:
    return EngineConfig(
        model=ModelConfig(runner="mock"),
        cache=CacheConfig(
            num_blocks=num_blocks,
            block_size=block_size,
            watermark=watermark,
            enable_prefix_caching=prefix_caching,
        ),
        scheduler=SchedulerConfig(
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len,
            enable_chunked_prefill=chunked,
            preempt_enabled=preempt,
        ),
    )


def make_engine(clock: VirtualClock | None = None, **kw: object) -> EngineCore:
    config = make_config(**kw)  # type: ignore[arg-type]
    runner = MockRunner(
        num_blocks=config.cache.num_blocks or 64,
        block_size=config.cache.block_size,
        vocab_size=VOCAB,
        eos_token_ids=(EOS,),
    )
    return EngineCore(config, runner, clock=clock or VirtualClock())


def timed_engine(speedup: float = 20.0, *, block_size: int = 4) -> EngineCore:
    """256 blocks on the real clock: the mock runner sleeps its modelled step time divided by
    ``speedup`` (~7 ms a decode step at 1.0), so a stream is still running when a test acts."""
    config = make_config(num_blocks=256, block_size=block_size, max_num_batched_tokens=32)
    runner = MockRunner(
        num_blocks=256,
        block_size=block_size,
        vocab_size=VOCAB,
        eos_token_ids=(EOS,),
        timing=TimingModel(speedup=speedup),
        clock=RealClock(),
    )
    return EngineCore(config, runner, clock=RealClock())


def timed_worker(
    wid: str,
    runtime: Runtime,
    *,
    speedup: float = 20.0,
    role: str = "both",
    model: str = "m",
    block_size: int = 4,
    transfer: TransferAgent | None = None,
    core: EngineCore | None = None,
) -> Worker:
    """A worker (not started yet) over ``core`` (default: a ``timed_engine``), on ``runtime``'s
    planes."""
    core = core or timed_engine(speedup, block_size=block_size)
    info = InstanceInfo(
        instance_id=wid,
        endpoint=subjects.GENERATE_ENDPOINT,
        model=model,
        role=role,
        block_size=block_size,
        kv_blocks_total=core.pool.num_blocks,
    )
    return Worker(
        core,
        info,
        discovery=runtime.discovery,
        requests=runtime.requests,
        events=runtime.events,
        transfer=transfer,
    )


def request(
    rid: str, prompt: Iterable[int], max_tokens: int = 8, *, priority: int = 0, **sampling: object
) -> GenerateRequest:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, **sampling)  # type: ignore[arg-type]
    return GenerateRequest(request_id=rid, token_ids=tuple(prompt), sampling=params, priority=priority)


def run_to_end(
    engine: EngineCore,
    *,
    max_steps: int = 10_000,
    each_step: Callable[[int], None] | None = None,
) -> dict[str, list[GenerateOutput]]:
    """Step until nothing is unfinished; returns every output per request, integrity checked."""
    outs: dict[str, list[GenerateOutput]] = {}
    for i in range(max_steps):
        if not engine.has_unfinished():
            return outs
        if each_step is not None:
            each_step(i)
        res = engine.step()
        engine.check_integrity()
        for o in res.outputs:
            outs.setdefault(o.request_id, []).append(o)
    raise AssertionError("engine did not finish")


def tokens(outs: list[GenerateOutput]) -> list[int]:
    return [t for o in outs for t in o.token_ids]


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()
