"""Enforced disaggregation with every prefill worker busy: the prefill leg waits in the router's
queue (as any routed request does) instead of a 503, and a wait that ends early leaves nothing
behind. In-process planes and mock engines; a worker is "busy" at ``max_inflight_per_worker``
requests (the router's own count: exact, no timing), and a gated prefill engine stays busy
until the test opens it."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest

from interlock.engine.runners.mock import MockRunner, reference_output
from interlock.errors import NoWorkers, Overloaded
from interlock.protocol import GenerateRequest, SamplingParams
from interlock.protocol.control import ControlRequest
from interlock.router.disagg import DisaggConfig
from interlock.router.disagg_flow import PREFILL_SUFFIX, DisaggFlow
from interlock.router.dispatcher import DispatchOptions
from interlock.router.model_router import Router, RouterConfig
from interlock.router.worker_control import control_call
from tests.disagg.cluster import eventually, mock_engine
from tests.engine.conftest import VOCAB
from tests.router.test_dispatcher import BLOCK, MODEL, Fleet, fleet


class Gated(MockRunner):
    """Each step waits until the gate opens (on the engine thread): its requests stay in flight."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.gate = threading.Event()

    def execute(self, batch):  # type: ignore[no-untyped-def]
        self.gate.wait(30)
        return super().execute(batch)


def flow(f: Fleet) -> DisaggFlow:
    assert f.service.disagg is not None
    return f.service.disagg


def router(f: Fleet) -> Router:
    return f.service.routers[MODEL]


def queued(f: Fleet) -> int:
    return len(router(f).queue)


def in_flight(f: Fleet, rid: str) -> bool:
    """Counted on a worker by the router (either leg)."""
    load = router(f).load
    return load.is_inflight(rid) or load.is_inflight(rid + PREFILL_SUFFIX)


async def add(f: Fleet, wid: str, role: str, *, gated: bool = False) -> Gated | None:
    core = mock_engine(runner_class=Gated if gated else MockRunner)
    await f.add(wid, role, core=core, agent=True)
    return core.runner if isinstance(core.runner, Gated) else None


@contextlib.asynccontextmanager
async def enforced(
    max_inflight: int, *, queue_timeout_s: float = 30.0, queue_capacity: int = 1024
) -> AsyncIterator[Fleet]:
    async with fleet(
        DispatchOptions(queue_timeout_s=queue_timeout_s),
        config=RouterConfig(
            block_size=BLOCK, max_inflight_per_worker=max_inflight, queue_capacity=queue_capacity
        ),
        disagg=DisaggConfig(enforce=True),
    ) as f:
        try:
            yield f
        finally:
            for w in f.workers.values():  # a gated engine's thread must end for it to close
                if isinstance(w.engine.core.runner, Gated):
                    w.engine.core.runner.gate.set()


def prompt(seed: int, n: int) -> list[int]:
    return [3 + (seed * 7919 + i * 104729) % (VOCAB - 3) for i in range(n)]


async def serve(f: Fleet, i: int, max_tokens: int = 5) -> str:
    """One request to its end: "ok" with the reference tokens, else the error's message."""
    p = prompt(i, 9 + 7 * i)
    req = GenerateRequest(
        request_id=f"r{i}",
        token_ids=tuple(p),
        model=MODEL,
        sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
    )
    got: list[int] = []
    try:
        stream = f.service.generate(req)
        async with contextlib.aclosing(stream):
            async for out in stream:
                got += out.token_ids
    except NoWorkers as exc:
        return exc.message
    assert got == reference_output(p, max_tokens, vocab_size=VOCAB), f"r{i}: wrong tokens"
    return "ok"


async def integrity(f: Fleet, wid: str) -> None:
    addr = f.workers[wid].info.metadata["control_address"]
    for _ in range(100):
        st = await control_call(f.runtime.requests, addr, ControlRequest(op="check_integrity"))
        if st.kv_blocks_used == 0 and st.live_transfers == 0:
            break
        await asyncio.sleep(0.05)
    assert st.ok and st.kv_blocks_used == 0 and st.live_transfers == 0, st


@pytest.mark.parametrize("workers", [("p", "d1", "d2"), ("p1", "p2", "d")])
def test_a_burst_waits_for_busy_workers_instead_of_a_503(workers: tuple[str, ...]) -> None:
    """Workers taking 2 at a time, 10 requests at once. With one prefill worker the 3rd on
    found the prefill pool busy and got 503 Retry-After (``no_prefill_worker``); now each
    waits its turn and every one is prefilled remotely. With one decode worker, requests that
    have their prefill worker wait for the decode worker in turn."""

    async def main() -> None:
        async with enforced(max_inflight=2) as f:
            for wid in workers:
                await add(f, wid, "prefill" if wid.startswith("p") else "decode")
            results = await asyncio.gather(*(serve(f, i) for i in range(10)))
            assert results == ["ok"] * 10
            assert flow(f).choices == {"enforced": 10} and flow(f).fallbacks == {}
            m = router(f).metrics
            assert m.queued >= 6 and m.rejected == 0
            # one request may wait twice (each leg): the metric says for which role
            assert (
                set(m.queued_by_role) <= {"prefill", "decode"} and sum(m.queued_by_role.values()) == m.queued
            )
            text = f.service.prometheus_text()
            for role, n in m.queued_by_role.items():
                assert f'interlock_router_queued_total{{model="{MODEL}",role="{role}"}} {n}\n' in text
            assert queued(f) == 0 and flow(f).pending == {}
            assert not any(in_flight(f, f"r{i}") for i in range(10))
            for wid in workers:
                await integrity(f, wid)

    asyncio.run(main())


def test_a_client_that_leaves_while_waiting_for_a_decode_worker_frees_its_prefill_worker() -> None:
    async def main() -> None:
        async with enforced(max_inflight=1) as f:
            await add(f, "p", "prefill")
            d = await add(f, "d", "decode", gated=True)
            tasks = [asyncio.create_task(serve(f, i)) for i in range(3)]
            # r0 decodes (gated); r1 has the prefill worker and waits for the decode worker;
            # r2 waits for the prefill worker.
            await eventually(lambda: queued(f) == 2 and in_flight(f, "r1"))
            assert router(f).load.is_inflight("r1" + PREFILL_SUFFIX)
            tasks[1].cancel()
            with pytest.raises(asyncio.CancelledError):
                await tasks[1]
            assert not in_flight(f, "r1")
            assert router(f).load.is_inflight("r2" + PREFILL_SUFFIX)  # it took the freed worker
            assert d is not None
            d.gate.set()
            assert [await tasks[0], await tasks[2]] == ["ok", "ok"]
            assert queued(f) == 0 and flow(f).pending == {} and not in_flight(f, "r2")

    asyncio.run(main())


def test_a_full_queue_answers_overloaded() -> None:
    async def main() -> None:
        async with enforced(max_inflight=1, queue_capacity=1) as f:
            p = await add(f, "p", "prefill", gated=True)
            await add(f, "d", "decode")
            tasks = [asyncio.create_task(serve(f, i)) for i in range(2)]
            await eventually(lambda: queued(f) == 1)
            with pytest.raises(Overloaded, match="all workers busy and 1 requests already waiting"):
                await serve(f, 2)
            assert not in_flight(f, "r2") and flow(f).choices == {"enforced": 1}
            assert p is not None
            p.gate.set()
            assert [await t for t in tasks] == ["ok", "ok"]

    asyncio.run(main())


def test_clients_that_leave_while_waiting_for_a_prefill_worker_leave_nothing() -> None:
    async def main() -> None:
        async with enforced(max_inflight=2) as f:
            p = await add(f, "p", "prefill", gated=True)
            await add(f, "d", "decode")
            tasks = [asyncio.create_task(serve(f, i)) for i in range(6)]
            await eventually(lambda: queued(f) == 4)  # r0, r1 on the prefill worker; r2-r5 wait
            assert flow(f).choices == {"enforced": 2}  # nothing chosen for those waiting
            assert not any(in_flight(f, f"r{i}") for i in range(2, 6))
            for t in tasks[2:4]:
                t.cancel()
            for t in tasks[2:4]:
                with pytest.raises(asyncio.CancelledError):
                    await t
            assert queued(f) == 2 and not in_flight(f, "r2") and not in_flight(f, "r3")
            assert set(flow(f).pending) == {"p"}  # only the two prefills running
            assert p is not None
            p.gate.set()
            assert [await t for t in (tasks[0], tasks[1], tasks[4], tasks[5])] == ["ok"] * 4
            assert flow(f).choices == {"enforced": 4} and flow(f).pending == {} and queued(f) == 0
            assert not any(in_flight(f, f"r{i}") for i in range(6))
            for wid in ("p", "d"):
                await integrity(f, wid)

    asyncio.run(main())


async def kill(f: Fleet, wid: str, gated: Gated) -> None:
    """The worker's lease runs out (the router breaks its streams), then its engine goes."""
    killing = asyncio.create_task(f.kill(wid))
    await eventually(lambda: wid not in router(f).workers())
    gated.gate.set()
    await killing


def test_requests_waiting_when_a_prefill_worker_dies_go_to_another() -> None:
    """Both prefill workers busy, two requests waiting; one prefill worker dies (its two
    running prefills fall back to their decode workers, as before): the waiting two are
    prefilled by the other one once it has room, none refused."""

    async def main() -> None:
        async with enforced(max_inflight=2) as f:
            p1 = await add(f, "p1", "prefill", gated=True)
            p2 = await add(f, "p2", "prefill", gated=True)
            await add(f, "d1", "decode")
            await add(f, "d2", "decode")
            tasks = [asyncio.create_task(serve(f, i)) for i in range(6)]
            await eventually(lambda: queued(f) == 2)
            assert p1 is not None and p2 is not None
            await kill(f, "p1", p1)
            assert queued(f) == 2  # p2 still busy: they keep waiting
            p2.gate.set()
            assert [await t for t in tasks] == ["ok"] * 6
            assert flow(f).choices == {"enforced": 6} and flow(f).fallbacks == {"prefill_failed": 2}
            assert f.workers["p2"].handoff.counters.staged == 4  # type: ignore[union-attr]
            assert queued(f) == 0 and flow(f).pending == {}

    asyncio.run(main())


def test_with_no_prefill_worker_left_a_waiting_request_gets_a_clear_503_at_once() -> None:
    """Not after the queue timeout (30 s here; it waited that long before): as a new request."""

    async def main() -> None:
        async with enforced(max_inflight=1) as f:
            p = await add(f, "p", "prefill", gated=True)
            await add(f, "d", "decode")
            first = asyncio.create_task(serve(f, 0))
            waiting = asyncio.create_task(serve(f, 1))
            await eventually(lambda: queued(f) == 1)
            assert p is not None
            await kill(f, "p", p)
            assert await asyncio.wait_for(waiting, 5) == (
                "disaggregation enforced but no_prefill_worker: no prefill worker left while it waited"
            )
            assert await first == "ok"  # its prefill failed: prefilled where it decodes
            assert queued(f) == 0 and flow(f).pending == {} and not in_flight(f, "r1")
            assert await serve(f, 2) == "disaggregation enforced but no_prefill_worker: " + (
                "no healthy worker available"
            )
            assert flow(f).choices == {"enforced": 1, "no_prefill_worker": 2}

    asyncio.run(main())


def test_a_failed_link_sends_the_prefill_to_another_prefill_worker() -> None:
    """The prefill worker holding the prompt's prefix (the ``kv`` policy's pick) failed its
    link check to the decode worker: the request is prefilled on the other one (it was
    refused, ``link_failed``, under enforce); with no other one it still is."""

    async def main() -> None:
        async with enforced(max_inflight=4) as f:
            for wid, role in (("p1", "prefill"), ("p2", "prefill"), ("d", "decode")):
                await add(f, wid, role)
            await eventually(lambda: {("p1", "d"), ("p2", "d")} <= set(flow(f).links), timeout_s=10.0)
            assert await serve(f, 0) == "ok"
            staged = {w: f.workers[w].handoff.counters.staged for w in ("p1", "p2")}  # type: ignore[union-attr]
            holder, other = ("p1", "p2") if staged["p1"] else ("p2", "p1")
            link, when = flow(f).links[(holder, "d")]
            flow(f).links[(holder, "d")] = (replace(link, ok=False), when)
            assert await serve(f, 0) == "ok"  # the same prompt: its prefix is on the holder
            assert f.workers[other].handoff.counters.staged == 1  # type: ignore[union-attr]
            assert flow(f).choices == {"enforced": 2} and flow(f).fallbacks == {}
            assert not in_flight(f, "r0") and queued(f) == 0
            flow(f).links[(other, "d")] = (replace(link, ok=False), when)
            assert await serve(f, 1) == "disaggregation enforced but link_failed"
            assert not in_flight(f, "r1") and flow(f).pending == {}

    asyncio.run(main())
