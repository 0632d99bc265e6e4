"""The router service believes only sane registrations, and a model's card follows its live
workers: a poisoned or departed registration leaves no trace in ``models()``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Iterator
from types import FrameType

import msgspec
import pytest

import interlock
from interlock.errors import NoWorkers, TransportError
from interlock.protocol import GenerateRequest, InstanceInfo, SamplingParams, subjects
from interlock.router.service import RouterService, ServiceOptions
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
    """At once: nothing starts a worker for a model not served on demand (one that is waits for
    one: ``test_service_empty_pool.py``)."""

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
        assert svc.waiting_for_worker() == 0

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


_PACKAGE = os.path.dirname(interlock.__file__) + os.sep


@contextlib.contextmanager
def _calls_in_interlock(tasks: set[asyncio.Task[None] | None]) -> Iterator[list[int]]:
    """Count the calls ``tasks`` make in interlock's own code (its functions, coroutine steps,
    and the builtins they call): the work done, counted where timing it would be flaky."""
    count = [0]

    def hook(frame: FrameType, event: str, arg: object) -> None:
        if (
            event in ("call", "c_call")
            and frame.f_code.co_filename.startswith(_PACKAGE)
            and asyncio.current_task() in tasks
        ):
            count[0] += 1

    previous = sys.getprofile()
    sys.setprofile(hook)
    try:
        yield count
    finally:
        sys.setprofile(previous)


def test_a_join_and_a_leave_do_the_same_work_in_a_fleet_of_10000_as_of_100() -> None:
    """10,000 workers join one router one by one, then leave. The calls made in interlock's code
    (the lease table and its watch, the service, the model's router) for 100 joins into a fleet
    of 9,900 are no more than for 100 joins into one of 100, and the same for leaves: a join
    and a leave cost O(1) (a tree's log at most), so a fleet's joins are linear, not quadratic.
    Counted, not timed (``benchmarks/discovery_scale.py`` times them): when each join recounted
    the model's card over every worker, a join into 9,900 made some 30,000 calls more."""
    n, window = 10_000, 100
    config = RuntimeConfig(heartbeat_interval=60.0, lease_timeout=120.0)  # nothing expires

    async def main() -> None:
        registry = InProcRegistry()
        runtime = await connect_runtime(None, config, registry=registry)
        svc = RouterService(discovery=runtime.discovery, requests=runtime.requests, events=runtime.events)
        before = asyncio.all_tasks()
        await svc.start()
        watch = next(t for t in asyncio.all_tasks() - before if "_watch" in t.get_coro().__qualname__)
        counted = {asyncio.current_task(), watch}  # not the periodic ticks, which visit every worker
        infos = [info(f"w{i:05d}") for i in range(n)]

        async def join(i: InstanceInfo) -> None:
            await runtime.discovery.register(i)

        async def leave(i: InstanceInfo) -> None:
            await runtime.discovery.unregister(i.instance_id)

        async def each(
            change: Callable[[InstanceInfo], Awaitable[None]], workers: list[InstanceInfo]
        ) -> None:
            for i in workers:
                await change(i)
                await asyncio.sleep(0)  # the service takes it in, on its own

        async def calls(
            change: Callable[[InstanceInfo], Awaitable[None]], workers: list[InstanceInfo]
        ) -> int:
            with _calls_in_interlock(counted) as made:
                await each(change, workers)
            return made[0]

        try:
            await each(join, infos[:window])
            small_joins = await calls(join, infos[window : 2 * window])
            await each(join, infos[2 * window : n - window])
            large_joins = await calls(join, infos[n - window :])
            assert len(svc.instances()) == n
            large_leaves = await calls(leave, infos[:window])
            await each(leave, infos[window : n - 2 * window])
            small_leaves = await calls(leave, infos[n - 2 * window : n - window])
            await each(leave, infos[n - window :])
            assert svc.instances() == [] and svc.routers == {}
        finally:
            await svc.close()
            await runtime.close()
            registry.leases.close()
        assert 0 < large_joins <= small_joins * 1.05, (small_joins, large_joins)
        assert 0 < large_leaves <= small_leaves * 1.05, (small_leaves, large_leaves)

    asyncio.run(main())


def test_the_cluster_view_draws_each_worker_and_joins_and_leaves_are_events() -> None:
    from interlock.metrics.events import EVENTS

    earlier = EVENTS.recent()  # held, so no new event can take an id of theirs
    before = {id(e) for e in earlier}

    async def body(runtime: Runtime, svc: RouterService) -> None:
        await runtime.discovery.register(info("w1", role="decode", metadata={"host": "h1"}))
        await _settle(svc, lambda: svc.instance("w1") is not None)
        report = load_report("w1", num_running=2, num_waiting=1, kv_blocks_used=16)
        await runtime.events.publish(subjects.load("w1"), msgspec.msgpack.encode(report))
        await _settle(svc, lambda: svc.report("w1") is not None)
        assert svc.cluster_view() == {
            "workers": [
                {
                    "id": "w1",
                    "model": "m",
                    "role": "decode",
                    "metadata": {"host": "h1"},
                    "breaker": "closed",
                    "eligible": True,
                    "reported": True,
                    "draining": False,
                    "num_running": 2,
                    "num_waiting": 1,
                    "kv_blocks_used": 16,
                    "kv_blocks_total": 64,
                    "weights_out_s": 0.0,
                }
            ],
            "models": {"m": {"decisions": {}, "queued": 0, "hit_rate": 0.0}},
        }
        await runtime.discovery.unregister("w1")
        await _settle(svc, lambda: svc.instance("w1") is None)
        assert svc.cluster_view() == {"workers": [], "models": {}}

    _run(body)
    recorded = [e for e in EVENTS.recent() if id(e) not in before]
    assert [(e.kind, e.subject, e.reason) for e in recorded] == [
        ("worker_joined", "w1", "m, decode"),
        ("worker_left", "w1", "drained"),
    ]


class _Pings:
    """The runtime's request plane, with the health-check pings answered as ``answers`` says
    (in turn, then the last one for good): True answers, False does not. ``before[k]``: what
    ``observe`` said when ping k + 1 was sent (the outcome of the first k)."""

    def __init__(self, inner: object, answers: list[bool]) -> None:
        self._inner = inner
        self.answers = answers
        self.before: list[bool] = []
        self.observe: Callable[[], bool] = lambda: True

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    async def ping(self, address: str, timeout: float | None = None) -> float:
        n = len(self.before)
        self.before.append(self.observe())
        if not self.answers[min(n, len(self.answers) - 1)]:
            raise TransportError(f"{address} did not answer")
        return 0.0


def test_one_missed_health_check_keeps_a_worker_two_in_a_row_take_it_out() -> None:
    """A ping answered late once (a loop held for a moment on busy cores) is no fault: the only
    worker taken out for it refused every request meanwhile. Two in a row take it out, and the
    next answer brings it back."""

    async def main() -> list[bool]:
        registry = InProcRegistry()
        runtime = await connect_runtime(None, CFG, registry=registry)
        pings = _Pings(runtime.requests, [True, False, True, True, False, False, False, True])
        svc = RouterService(
            discovery=runtime.discovery,
            requests=pings,  # type: ignore[arg-type]
            events=runtime.events,
            options=ServiceOptions(health_check_s=0.02),
        )
        await svc.start()
        try:
            await runtime.discovery.register(info("a"))
            await _settle(svc, lambda: "m" in svc.routers and "a" in svc.routers["m"].workers())
            pings.before.clear()  # from here on, every ping is to "a"
            pings.observe = lambda: svc.routers["m"].is_eligible("a")
            await _settle(svc, lambda: len(pings.before) >= 10)
        finally:
            await svc.close()
            await runtime.close()
        return pings.before

    before = asyncio.run(main())
    # the answers: ok, miss, ok, ok, miss, miss, miss, ok
    assert before[2] and before[3]  # after ok, miss (and ok): the single miss left it in
    assert not before[6] and not before[7]  # after the second and third miss in a row: out
    assert before[8] and before[9]  # it answered: back
