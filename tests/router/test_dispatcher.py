"""The dispatcher keeps a request alive across worker failures (in-process planes, mock engines
on the real clock, so a stream is still running when its worker goes).

The mock model's next token is a hash of the KV it reads back, so a migrated request whose KV
is recomputed elsewhere continues with exactly the tokens an undisturbed one gets."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest

from interlock.engine.core import EngineCore
from interlock.engine.timing import TimingModel
from interlock.engine.worker import Worker
from interlock.errors import NoWorkers, TransportError, WorkerFailed
from interlock.protocol import GenerateOutput, GenerateRequest, SamplingParams
from interlock.protocol.routing import RequestContext
from interlock.router.admission import RequestMeta
from interlock.router.breaker import BreakerConfig
from interlock.router.disagg import DisaggConfig
from interlock.router.dispatcher import DispatchOptions
from interlock.router.model_router import Router, RouterConfig
from interlock.router.service import RouterService, ServiceOptions
from interlock.runtime import InProcRegistry, connect_runtime
from interlock.runtime.runtime import Runtime
from interlock.transfer import TransferAgent
from tests.engine.conftest import timed_worker

MODEL = "m"
BLOCK = 4


class Fleet:
    def __init__(self, runtime: Runtime, service: RouterService, registry: InProcRegistry) -> None:
        self.runtime = runtime
        self.service = service
        self.registry = registry
        self.workers: dict[str, Worker] = {}
        self.agents: list[TransferAgent] = []

    async def add(
        self,
        wid: str,
        role: str = "both",
        speedup: float = 20.0,
        *,
        core: EngineCore | None = None,
        agent: bool = False,
    ) -> Worker:
        """A started worker over ``core`` (default: a timed mock engine); ``agent``: with a KV
        transfer agent (disaggregation)."""
        transfer = TransferAgent() if agent else None
        if transfer is not None:
            self.agents.append(transfer)
        w = timed_worker(
            wid,
            self.runtime,
            speedup=speedup,
            role=role,
            model=MODEL,
            block_size=BLOCK,
            transfer=transfer,
            core=core,
        )
        await w.start()
        self.workers[wid] = w
        assert await self.service.wait_for_workers(len(self.workers), 5.0) == len(self.workers)
        return w

    async def kill(self, wid: str) -> None:
        """Gone at once, as a dead worker's lease running out (no goodbye: an unregister would
        be a drain, whose streams run on): its streams break; then it stops."""
        w = self.workers.pop(wid)
        self.registry.leases.remove(wid)
        await self.runtime.discovery.unregister(wid)  # its heartbeat: else it would come back
        await w.close()


@contextlib.asynccontextmanager
async def fleet(
    options: DispatchOptions = DispatchOptions(),
    *,
    breaker: BreakerConfig = BreakerConfig(),
    config: RouterConfig = RouterConfig(block_size=BLOCK),
    disagg: DisaggConfig | None = None,
) -> AsyncIterator[Fleet]:
    registry = InProcRegistry()
    runtime = await connect_runtime(None, registry=registry)
    service = RouterService(
        discovery=runtime.discovery,
        requests=runtime.requests,
        events=runtime.events,
        config=config,
        options=ServiceOptions(dispatch=options, breaker=breaker),
        disagg=disagg,
    )
    await service.start()
    f = Fleet(runtime, service, registry)
    try:
        yield f
    finally:
        for w in list(f.workers.values()):
            await w.close()
        for ag in f.agents:
            ag.close()
        await service.close()
        await runtime.close()


def request(rid: str, max_tokens: int = 60, **sampling: object) -> GenerateRequest:
    return GenerateRequest(
        request_id=rid,
        token_ids=tuple(range(10, 31)),
        model=MODEL,
        sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **sampling),
    )  # type: ignore[arg-type]


async def collect(
    f: Fleet, req: GenerateRequest, *, pin: str | None = None, after: int = 0, action: object = None
) -> list[GenerateOutput]:
    """Stream ``req``; once ``after`` tokens are in, await ``action(worker_id)``."""
    ctx = RequestContext(request_id=req.request_id, endpoint="completions", worker_id=pin, explain=True)
    outs: list[GenerateOutput] = []
    done = False
    stream = f.service.generate(req, ctx)
    async with contextlib.aclosing(stream):
        async for out in stream:
            outs.append(out)
            if action is not None and not done and sum(len(o.token_ids) for o in outs) >= after:
                done = True
                worker = ctx.response_headers["x-interlock-route"].split(";")[0].split("=")[-1]
                await action(worker)  # type: ignore[operator]
    return outs


def toks(outs: list[GenerateOutput]) -> list[int]:
    return [t for o in outs for t in o.token_ids]


def test_explain_header_names_the_worker() -> None:
    async def main() -> None:
        async with fleet() as f:
            await f.add("a")
            seen: list[str] = []

            async def note(worker: str) -> None:
                seen.append(worker)

            await collect(f, request("r", 4), pin="a", after=1, action=note)
            assert seen == ["a"]

    asyncio.run(main())


@pytest.mark.parametrize("logprobs", [None, 2])
def test_a_killed_worker_s_stream_continues_elsewhere_unchanged(logprobs: int | None) -> None:
    async def main() -> None:
        async with fleet() as f:
            await f.add("a")
            await f.add("b")
            reference = await collect(f, request("ref", logprobs=logprobs), pin="b")
            outs = await collect(f, request("r", logprobs=logprobs), pin="a", after=7, action=f.kill)
            assert toks(outs) == toks(reference) and len(toks(outs)) == 60
            assert outs[-1].finish_reason == "length" and outs[-1].num_prompt_tokens == 21
            if logprobs is not None:
                lp = [x for o in outs for x in (o.logprobs or ())]
                assert [x.token_id for x in lp] == toks(reference)
            m = f.service.dispatcher.metrics
            assert m.migrations == 1 and m.migrations_exhausted == 0
            assert "interlock_router_migrations_total 1" in f.service.prometheus_text()
            # the planner's arrivals: two requests, though the migrated leg was routed too
            rm = f.service.routers[MODEL].metrics
            assert (rm.decisions, rm.requests, rm.request_prompt_tokens) == (3, 2, 42)

    asyncio.run(main())


def test_migration_limit_zero_fails_the_request() -> None:
    async def main() -> None:
        async with fleet(DispatchOptions(migration_limit=0)) as f:
            await f.add("a")
            await f.add("b")
            with pytest.raises(TransportError):
                await collect(f, request("r"), pin="a", after=5, action=f.kill)

    asyncio.run(main())


def test_the_limit_is_per_request_and_its_error_is_clear() -> None:
    async def main() -> None:
        async with fleet(DispatchOptions(migration_limit=1)) as f:
            for wid in ("a", "b", "c"):
                await f.add(wid)
            kills = 0

            async def kill_every_worker(worker: str) -> None:
                nonlocal kills
                kills += 1
                await f.kill(worker)

            req = request("r", 200)
            ctx = RequestContext(request_id="r", endpoint="completions", worker_id="a", explain=True)
            stream = f.service.generate(req, ctx)
            got = 0
            with pytest.raises(WorkerFailed, match="migration limit 1"):
                async with contextlib.aclosing(stream):
                    async for out in stream:
                        got += len(out.token_ids)
                        if got >= 5 * (kills + 1):  # kill whichever worker serves it now
                            wid = next(iter(f.service.dispatcher._watches))
                            await kill_every_worker(wid)
            assert kills == 2

    asyncio.run(main())


def test_a_stalled_worker_is_left_after_the_stall_timeout() -> None:
    async def main() -> None:
        async with fleet(DispatchOptions(stall_floor_s=0.3, stall_steps=1.0)) as f:
            a = await f.add("a", speedup=1.0)  # ~7 ms steps: still streaming when it hangs
            await f.add("b")
            reference = await collect(f, request("ref"), pin="b")

            async def hang(worker: str) -> None:  # the next step takes ~1.5 s
                a.engine.core.runner.timing = TimingModel(speedup=0.005)

            outs = await collect(f, request("r"), pin="a", after=5, action=hang)
            assert toks(outs) == toks(reference)
            assert f.service.dispatcher.metrics.stalls == 1
            a.engine.core.runner.timing = TimingModel(speedup=20.0)

    asyncio.run(main())


def test_a_draining_worker_hands_over_what_it_has_not_finished_when_its_grace_is_over() -> None:
    """(Within the grace its streams finish on it: tests/engine/test_worker.py.)"""

    async def main() -> None:
        async with fleet() as f:
            a = await f.add("a", speedup=1.0)
            await f.add("b")
            reference = await collect(f, request("ref"), pin="b")

            async def drain(worker: str) -> None:
                asyncio.ensure_future(a.drain(grace_s=0.05))

            outs = await collect(f, request("r"), pin="a", after=5, action=drain)
            assert toks(outs) == toks(reference)
            m = f.service.dispatcher.metrics
            assert m.migrations == 1 and m.worker_aborts == 1
            assert f.service.dispatcher.breakers.tracked() == 0  # a worker that left keeps no breaker
            f.workers.pop("a")

    asyncio.run(main())


async def eligible_again(router: Router, worker_id: str) -> None:
    """Wait (5 s at most) for the worker's cool-down to end: routable again."""
    deadline = asyncio.get_running_loop().time() + 5
    while not router.is_eligible(worker_id):
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.05)


def test_repeated_failures_open_the_breaker_then_a_probe_closes_it() -> None:
    async def main() -> None:
        cfg = BreakerConfig(failures=2, window_s=30.0, cooldown_s=0.5, incident_s=0.0)
        async with fleet(breaker=cfg) as f:
            await f.add("a")
            await f.add("b")
            svc = f.service
            router = svc.routers[MODEL]
            svc.dispatcher._worker_failed(router, "a", TransportError("x"))
            assert router.is_eligible("a") is False  # unhealthy until its next report
            svc.dispatcher._worker_failed(router, "a", TransportError("y"))
            assert svc.dispatcher.breakers.blocked("a")
            await asyncio.sleep(0.2)  # a load report makes it healthy, the breaker still holds it
            assert not router.is_eligible("a")
            await eligible_again(router, "a")
            outs = await collect(f, request("probe", 4), pin="a")  # the probe passes
            assert len(toks(outs)) == 4 and not svc.dispatcher.breakers.blocked("a")

    asyncio.run(main())


def test_a_probe_whose_request_ends_without_streaming_there_unblocks_the_worker() -> None:
    """A probe routed, then released with neither output nor failure (a disaggregated prefill
    leg that stays local, a request finished elsewhere, a client gone): the worker is not left
    blocked; the next request routed there is the probe."""

    async def main() -> None:
        cfg = BreakerConfig(failures=1, window_s=30.0, cooldown_s=0.05, incident_s=0.0)
        async with fleet(breaker=cfg) as f:
            await f.add("a")
            await f.add("b")
            svc = f.service
            router, breakers = svc.routers[MODEL], svc.dispatcher.breakers
            svc.dispatcher._worker_failed(router, "a", TransportError("x"))
            await eligible_again(router, "a")
            meta = RequestMeta(request_id="probe", prompt_tokens=8, worker_id="a")
            d = await svc.dispatcher.route(router, meta, [])
            assert d.worker_id == "a" and breakers.blocked("a")
            svc.dispatcher.finish(router, "probe")  # released unstreamed
            assert not breakers.blocked("a") and router.is_eligible("a")
            outs = await collect(f, request("next", 4), pin="a")  # the next one is the probe
            assert len(toks(outs)) == 4 and breakers.tracked() == 0

    asyncio.run(main())


def test_disaggregated_decode_worker_killed_mid_stream() -> None:
    async def main() -> None:
        async with fleet(disagg=DisaggConfig(enforce=True)) as f:
            for wid, role in (("p", "prefill"), ("d1", "decode"), ("d2", "decode")):
                await f.add(wid, role, agent=True)
            reference = await collect(f, request("ref"), pin="d2")
            outs = await collect(f, request("r"), pin="d1", after=6, action=f.kill)
            assert toks(outs) == toks(reference) and len(toks(outs)) == 60
            # usage: the prefill worker's hit (5 blocks of 4: "ref" prefilled the same prompt
            # there), not the decode worker's import (all 21) nor what the migrated leg found
            assert {o.num_cached_tokens for o in outs} == {20}
            assert f.service.dispatcher.metrics.migrations == 1
            assert f.service.dispatcher.metrics.recent[-1].cached_tokens == 20  # the planner's too
            assert f.service.disagg is not None and not f.service.disagg.pending

    asyncio.run(main())


def test_a_finished_request_is_recorded_for_the_planner() -> None:
    async def body() -> None:
        async with fleet() as f:
            await f.add("w0")
            outs = await collect(f, request("r1", max_tokens=12))
            m = f.service.dispatcher.metrics
            [c] = list(m.recent)
            assert m.completed == 1 and c.output_tokens == len(toks(outs)) == 12
            assert c.prompt_tokens == 21 and 0 < c.ttft_s and 0 < c.decode_s and c.model == MODEL
            assert time.monotonic() - c.arrived_s >= c.ttft_s + c.decode_s

    asyncio.run(body())


def test_a_queued_wait_that_ends_early_leaves_no_entry_and_no_load() -> None:
    """A request waiting in the router's queue whose client leaves, whose wait times out, or
    which is dispatched in the same instant as it is cancelled: nothing stays queued or counted
    on the worker (a leaked dispatch would keep the worker busy for good)."""

    async def body() -> None:
        one = RouterConfig(block_size=BLOCK, max_inflight_per_worker=1)
        async with fleet(DispatchOptions(queue_timeout_s=0.2), config=one) as f:
            await f.add("w0")
            disp, router = f.service.dispatcher, f.service.routers[MODEL]
            await disp.route(router, RequestMeta("a", prompt_tokens=8), [])
            gone = asyncio.create_task(disp.route(router, RequestMeta("b", prompt_tokens=8), []))
            await asyncio.sleep(0)
            assert len(router.queue) == 1
            gone.cancel()
            with pytest.raises(asyncio.CancelledError):
                await gone
            assert len(router.queue) == 0 and not router.load.is_inflight("b")
            with pytest.raises(NoWorkers, match="timed out after 0.2 s waiting for a free decode worker"):
                await disp.route(router, RequestMeta("c", prompt_tokens=8, role="decode"), [])
            assert len(router.queue) == 0 and not router.load.is_inflight("c")
            raced = asyncio.create_task(disp.route(router, RequestMeta("d", prompt_tokens=8), []))
            await asyncio.sleep(0)
            disp.finish(router, "a")  # "d" is dispatched: its wait is over, but not yet resumed
            assert router.load.is_inflight("d")
            raced.cancel()
            with pytest.raises(asyncio.CancelledError):
                await raced
            assert not router.load.is_inflight("d") and len(router.queue) == 0

    asyncio.run(body())


def test_requests_queued_when_the_last_worker_leaves_fail_at_once() -> None:
    """With every worker gone a queued request gets NoWorkers (503 + Retry-After) at once, as a
    new one does, not after the queue timeout (30 s). One whose worker is only unhealthy (a
    failed stream, a restart under way) keeps waiting for it."""

    async def body() -> None:
        one = RouterConfig(block_size=BLOCK, max_inflight_per_worker=1)
        async with fleet(config=one) as f:
            await f.add("w0")
            disp, router = f.service.dispatcher, f.service.routers[MODEL]
            await disp.route(router, RequestMeta("a", prompt_tokens=8), [])
            waiting = asyncio.create_task(disp.route(router, RequestMeta("b", prompt_tokens=8), []))
            await asyncio.sleep(0)
            router.set_health("w0", False)
            disp.fail_stranded(router)
            await asyncio.sleep(0)
            assert len(router.queue) == 1 and not waiting.done()
            await f.kill("w0")
            with pytest.raises(NoWorkers, match="no worker left while it waited") as exc:
                await asyncio.wait_for(waiting, 5)
            assert exc.value.retry_after == 1.0 and len(router.queue) == 0
            assert MODEL not in f.service.routers

    asyncio.run(body())


def test_the_stall_timer_counts_from_the_last_chunk_and_only_its_own_cancel_is_a_stall() -> None:
    """One lazily re-armed timer per leg (``_Watch``): chunks that keep coming, each within the
    limit, never stall even when the stream lasts many limits; a gap past it does; a cancel
    from outside (the client left) stays a cancel; ``worker_left`` breaks a waiting leg at once."""
    from interlock.router.dispatcher import Dispatcher, LegBroken, _Watch

    async def chunks(gaps: list[float]) -> AsyncIterator[bytes]:
        for gap in gaps:
            await asyncio.sleep(gap)
            yield b"x"

    async def main() -> None:
        rt = await connect_runtime(None, registry=InProcRegistry())
        service = RouterService(
            discovery=rt.discovery,
            requests=rt.requests,
            events=rt.events,
            config=RouterConfig(block_size=BLOCK),
            options=ServiceOptions(dispatch=DispatchOptions(stall_floor_s=0.1, stall_steps=1.0)),
        )
        d: Dispatcher = service.dispatcher
        try:
            watch = _Watch("w")
            it = aiter(chunks([0.06] * 8 + [0.25]))  # 0.48 s of chunks 0.06 s apart, then a gap
            for _ in range(8):
                assert await d._next(it, watch, "w", first=False) == b"x"
            with pytest.raises(LegBroken, match="sent nothing for 0.1 s"):
                await d._next(it, watch, "w", first=False)
            assert d.metrics.stalls == 1
            watch.close()

            watch = _Watch("w")
            waiting = asyncio.create_task(d._next(aiter(chunks([5.0])), watch, "w", first=False))
            await asyncio.sleep(0.02)
            waiting.cancel()  # the client left
            with pytest.raises(asyncio.CancelledError):
                await waiting
            await asyncio.sleep(0.15)  # the timer, if still armed, finds nothing to cancel
            assert d.metrics.stalls == 1
            watch.close()

            watch = _Watch("w")
            waiting = asyncio.create_task(d._next(aiter(chunks([5.0])), watch, "w", first=True))
            await asyncio.sleep(0.02)
            watch.break_(LegBroken("worker w left"))
            with pytest.raises(LegBroken, match="worker w left"):
                await waiting
            assert d.metrics.stalls == 1 and asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]

            async def fails_when_cancelled() -> AsyncIterator[bytes]:
                try:
                    await asyncio.sleep(5)
                    yield b"x"
                except asyncio.CancelledError:
                    raise ConnectionError("the plane broke while closing") from None

            watch = _Watch("w")  # the timer's cancel turns into another error: still taken back
            with pytest.raises(ConnectionError):
                await d._next(aiter(fails_when_cancelled()), watch, "w", first=False)
            assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
            watch.close()
        finally:
            await service.close()
            await rt.close()

    asyncio.run(main())
