"""The router service believes only sane registrations, and a model's card follows its live
workers: a poisoned or departed registration leaves no trace in ``models()``."""

from __future__ import annotations

import asyncio
import logging

import msgspec
import pytest

from interlock.errors import NoWorkers
from interlock.protocol import GenerateRequest, InstanceInfo, SamplingParams, subjects
from interlock.router.service import RouterService
from interlock.runtime import InProcRegistry, RuntimeConfig, connect_runtime
from interlock.runtime.runtime import Runtime
from tests.factories import load_report

CFG = RuntimeConfig(heartbeat_interval=0.05, lease_timeout=0.3)


def info(wid: str, context_length: int = 2048, model: str = "m", **fields: object) -> InstanceInfo:
    return InstanceInfo(
        instance_id=wid,
        endpoint=subjects.GENERATE_ENDPOINT,
        model=model,
        address=f"inproc://{subjects.GENERATE_ENDPOINT}.{wid}",
        block_size=16,
        kv_blocks_total=64,
        context_length=context_length,
        publishes_kv_events=False,
        **fields,
    )  # type: ignore[arg-type]


async def _settle(svc: RouterService, check, timeout_s: float = 2.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


def _run(body) -> None:  # type: ignore[no-untyped-def]
    async def main() -> None:
        registry = InProcRegistry()
        runtime = await connect_runtime(None, CFG, registry=registry)
        svc = RouterService(discovery=runtime.discovery, requests=runtime.requests, events=runtime.events)
        await svc.start()
        try:
            await body(runtime, svc)
        finally:
            await svc.close()
            await runtime.close()
            registry.leases.close()

    asyncio.run(main())


def _ctx(svc: RouterService) -> dict[str, int]:
    return {m.name: m.context_length for m in svc.models()}


def test_a_poisoned_context_length_never_reaches_models(caplog: pytest.LogCaptureFixture) -> None:
    async def body(runtime: Runtime, svc: RouterService) -> None:
        with caplog.at_level(logging.WARNING, logger="interlock.router.service"):
            await runtime.discovery.register(info("fake", context_length=10**9))
            await runtime.discovery.register(info("fake2", model="other", context_length=10**9))
            await runtime.discovery.register(info("real"))
            await _settle(svc, lambda: svc.instance("real") is not None)
        assert _ctx(svc) == {"m": 2048}
        assert svc.instance("fake") is None and svc.instance("fake2") is None
        assert "refused registration of worker 'fake': context_length" in caplog.text

    _run(body)


def test_the_card_follows_the_live_workers() -> None:
    async def body(runtime: Runtime, svc: RouterService) -> None:
        await runtime.discovery.register(info("real"))
        await _settle(svc, lambda: _ctx(svc) == {"m": 2048})
        await runtime.discovery.register(info("big", context_length=8192))
        await runtime.discovery.unregister("real")
        await _settle(svc, lambda: _ctx(svc) == {"m": 8192})  # no trace of the one that left
        await runtime.discovery.register(info("pre", context_length=16, role="prefill"))
        await _settle(svc, lambda: svc.instance("pre") is not None)
        assert _ctx(svc) == {"m": 8192}  # a prefill-only worker takes no requests of its own

    _run(body)


def test_one_worker_cannot_shrink_the_model_for_everyone(caplog: pytest.LogCaptureFixture) -> None:
    """A worker re-announcing itself with context_length=1 (its own login allows that) is held
    out of routing; the model's card, and every other worker, serve on."""

    async def body(runtime: Runtime, svc: RouterService) -> None:
        await runtime.discovery.register(info("a"))
        await runtime.discovery.register(info("b"))
        await _settle(svc, lambda: svc.instance("b") is not None)
        with caplog.at_level(logging.WARNING, logger="interlock.router.service"):
            await runtime.discovery.register(info("b", context_length=1))
            await runtime.discovery.register(info("c", context_length=100))
            await _settle(svc, lambda: svc.instance("b") is None and len(svc.degraded()) == 2)
        assert _ctx(svc) == {"m": 2048}
        assert [i.instance_id for i in svc.instances()] == ["a"]
        assert "worker b announces" in caplog.text and "held out of routing" in caplog.text
        await runtime.discovery.register(info("b"))  # back to the model's card: routed again
        await _settle(svc, lambda: svc.instance("b") is not None)
        assert len(svc.degraded()) == 1

    _run(body)


def test_a_rolling_upgrade_moves_the_card_once_most_workers_carry_the_new_one() -> None:
    async def body(runtime: Runtime, svc: RouterService) -> None:
        for wid in ("old1", "old2"):
            await runtime.discovery.register(info(wid))
        await _settle(svc, lambda: len(svc.instances()) == 2)
        await runtime.discovery.register(info("new1", context_length=4096))
        await runtime.discovery.register(info("new2", context_length=4096))
        await _settle(svc, lambda: len(svc.degraded()) == 2)
        assert _ctx(svc) == {"m": 2048}  # a tie keeps the card the model has
        await runtime.discovery.register(info("new3", context_length=4096))
        await _settle(svc, lambda: _ctx(svc) == {"m": 4096})
        await _settle(svc, lambda: [i.instance_id for i in svc.instances()] == ["new1", "new2", "new3"])
        await runtime.discovery.unregister("old1")
        await runtime.discovery.unregister("old2")
        await _settle(svc, lambda: svc.degraded() == [])

    _run(body)


def test_a_model_whose_workers_left_keeps_its_last_card_and_503s() -> None:
    async def body(runtime: Runtime, svc: RouterService) -> None:
        await runtime.discovery.register(info("real", context_length=4096))
        await _settle(svc, lambda: _ctx(svc) == {"m": 4096})
        await runtime.discovery.unregister("real")
        await _settle(svc, lambda: svc.instance("real") is None)
        assert _ctx(svc) == {"m": 4096}
        with pytest.raises(NoWorkers):
            svc.generate(
                GenerateRequest(
                    request_id="r", model="m", token_ids=(1, 2), sampling=SamplingParams(max_tokens=1)
                )
            )

    _run(body)


def test_a_load_report_on_another_worker_s_subject_is_ignored() -> None:
    async def body(runtime: Runtime, svc: RouterService) -> None:
        await runtime.discovery.register(info("real"))
        await _settle(svc, lambda: svc.instance("real") is not None)
        forged = load_report("real", draining=True)
        await runtime.events.publish(subjects.load("attacker"), msgspec.msgpack.encode(forged))
        await runtime.events.publish(
            subjects.load("real"),
            msgspec.msgpack.encode(msgspec.structs.replace(forged, draining=False, num_running=3)),
        )
        await _settle(svc, lambda: svc.report("real") is not None)
        report = svc.report("real")
        assert report is not None and not report.draining and report.num_running == 3

    _run(body)
