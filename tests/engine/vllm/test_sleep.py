"""vLLM's sleep mode driven by idleness (``engine.vllm.sleep.Sleeper``), against a small object
shaped like vLLM's ``AsyncLLM`` (its ``sleep`` and ``wake_up``); no vLLM started. And the engine
arguments that turn it on."""

from __future__ import annotations

import asyncio

import pytest

from interlock.engine.config import EngineConfig, ModelConfig
from interlock.engine.vllm.args import vllm_engine_args
from interlock.engine.vllm.sleep import SLEEP_LEVEL, Sleeper
from interlock.errors import ConfigError


class FakeLLM:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def sleep(self, level: int) -> None:
        self.calls.append(f"sleep {level}")
        await self.gate.wait()

    async def wake_up(self) -> None:
        self.calls.append("wake")
        await asyncio.sleep(0.01)


class Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


def test_an_idle_engine_sleeps_and_the_next_request_wakes_it() -> None:
    async def scenario() -> None:
        llm, clock, changes = FakeLLM(), Clock(), []
        s = Sleeper(llm, 30.0, lambda: changes.append(s.weights_load_s), clock=clock)
        async with s.serving():
            clock.t = 100.0
            assert not await s.sleep_if_due()  # a request in flight: never
        clock.t = 129.0
        assert not await s.sleep_if_due()  # idle 29 s of 30
        clock.t = 130.0
        assert await s.sleep_if_due() and s.asleep and llm.calls == [f"sleep {SLEEP_LEVEL}"]
        assert s.weights_load_s > 0 and changes == [s.weights_load_s]  # the router prices it
        async with s.serving():  # the next request: woken first
            assert not s.asleep and llm.calls[-1] == "wake"
        assert s.weights_load_s == 0 and changes[-1] == 0 and s.wakes == 1
        assert await s.wake() == 0.0  # awake: nothing to do

    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_a_request_that_arrives_while_it_goes_to_sleep_waits_then_wakes_it() -> None:
    async def scenario() -> None:
        llm, clock = FakeLLM(), Clock()
        s = Sleeper(llm, 1.0, lambda: None, clock=clock)
        clock.t = 5.0
        llm.gate.clear()  # sleep() blocks until released
        going = asyncio.create_task(s.sleep_if_due())
        await asyncio.sleep(0.01)
        assert s.asleep  # marked before vLLM's sleep returns

        async def request() -> list[str]:
            async with s.serving():
                return list(llm.calls)

        req = asyncio.create_task(request())
        await asyncio.sleep(0.01)
        assert not req.done()  # waits for the sleep to finish: vLLM would abort it inside
        llm.gate.set()
        assert await going
        assert await req == [f"sleep {SLEEP_LEVEL}", "wake"]

    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_sleep_mode_is_vllms_engine_argument_and_the_worker_owns_it() -> None:
    known = {"enable_sleep_mode", "enforce_eager"}
    on = EngineConfig(model=ModelConfig(model="/m", engine="vllm", device="cuda", offload_after_s=60))
    assert vllm_engine_args(on, known)["enable_sleep_mode"] is True
    off = EngineConfig(model=ModelConfig(model="/m", engine="vllm", device="cuda"))
    assert "enable_sleep_mode" not in vllm_engine_args(off, known)
    mine = EngineConfig(
        model=ModelConfig(model="/m", engine="vllm", engine_args=(("enable_sleep_mode", True),))
    )
    with pytest.raises(ConfigError, match="set offload_after_s"):
        vllm_engine_args(mine, known)
