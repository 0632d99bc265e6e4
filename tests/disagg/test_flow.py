"""The disaggregated path end to end in one process, on mock runners (fast, exact oracle)."""

from __future__ import annotations

import asyncio
import contextlib

from interlock.deploy import Routing
from interlock.engine.runners.mock import reference_output
from interlock.errors import NoWorkers
from interlock.planner.live import RouterServiceView
from interlock.planner.loop import TrafficTotals
from interlock.protocol import GenerateOutput, GenerateRequest, SamplingParams
from interlock.protocol.control import ControlRequest
from interlock.router.disagg_flow import NO_PREFILL_WAIT_S
from tests.disagg.cluster import MODEL, cluster, eventually, mock_engine, tokens
from tests.engine.conftest import VOCAB


def prompt(seed: int, n: int) -> list[int]:
    return [3 + (seed * 7919 + i * 104729) % (VOCAB - 3) for i in range(n)]


def test_remote_prefill_streams_the_reference_tokens_once() -> None:
    async def main() -> None:
        async with cluster() as c:
            await c.add_worker("p", "prefill", mock_engine())
            await c.add_worker("d", "decode", mock_engine())
            await c.wait_for(2)
            for i, n in enumerate((5, 40, 77)):
                p = prompt(i, n)
                outs = await c.generate(f"r{i}", p, 6)
                assert tokens(outs) == reference_output(p, 6, vocab_size=VOCAB)
                assert outs[-1].finish_reason == "length"
            assert c.service.disagg is not None
            assert c.service.disagg.choices == {"enforced": 3}
            assert c.workers["d"].handoff.counters.pulled == 3  # type: ignore[union-attr]
            assert c.workers["d"].handoff.counters.transports == {"inproc": 3}  # type: ignore[union-attr]
            for wid in ("p", "d"):
                st = await c.control(wid, ControlRequest(op="check_integrity"))
                assert st.ok and st.kv_blocks_used == 0, st

    asyncio.run(main())


def cached(outs: list[GenerateOutput]) -> set[int]:
    """The cached prompt tokens every chunk reports (the frontend's usage takes their max)."""
    return {o.num_cached_tokens for o in outs}


def test_a_remote_prefill_reports_the_prefill_worker_s_cache_hit() -> None:
    """The decode worker imports the whole prompt's KV, so its engine counts every prompt token
    as cached; the request's usage is the hit of the prefill that computed it: none the first
    time, the prompt's full blocks (5 of 4 tokens, less the last token's) the second."""

    async def main() -> None:
        async with cluster() as c:
            await c.add_worker("p", "prefill", mock_engine())
            await c.add_worker("d", "decode", mock_engine())
            await c.wait_for(2)
            p = prompt(7, 22)
            assert cached(await c.generate("a", p, 5)) == {0}
            assert cached(await c.generate("b", p, 5)) == {20}
            assert c.service.disagg is not None and c.service.disagg.choices == {"enforced": 2}
            # the planner's arrivals: two requests, though four legs were routed
            m = c.service.routers[MODEL].metrics
            assert (m.decisions, m.requests, m.request_prompt_tokens) == (4, 2, 44)
            assert RouterServiceView(c.service).totals() == TrafficTotals(2, 44, m.request_cached_tokens)

    asyncio.run(main())


def test_auto_choice_stays_local_without_queue_and_counts_the_reason() -> None:
    """Both idle and equally fast: the transfer only adds time, so the decode worker prefills."""

    async def main() -> None:
        async with cluster(Routing()) as c:
            await c.add_worker("p", "prefill", mock_engine())
            await c.add_worker("d", "decode", mock_engine())
            await c.wait_for(2)
            p = prompt(1, 30)
            assert tokens(await c.generate("a", p, 4)) == reference_output(p, 4, vocab_size=VOCAB)
            assert c.service.disagg is not None
            assert c.service.disagg.choices == {"local_faster": 1}
            m = c.service.routers[MODEL].metrics  # the probe for a prefill worker is no request
            assert (m.decisions, m.requests, m.request_prompt_tokens) == (2, 1, 30)
            assert 'interlock_router_requests_total{model="m"} 1' in c.service.prometheus_text()
            assert 'interlock_disagg_choices_total{reason="local_faster"} 1' in c.service.prometheus_text()

    asyncio.run(main())


def test_a_prompt_logprobs_request_is_computed_by_its_decode_worker_even_when_enforced() -> None:
    """A KV hand-off carries no logits: the decode worker computes the prompt (and its logprobs)."""

    async def main() -> None:
        async with cluster() as c:
            await c.add_worker("p", "prefill", mock_engine())
            await c.add_worker("d", "decode", mock_engine())
            await c.wait_for(2)
            p = prompt(3, 30)
            sampling = SamplingParams(max_tokens=4, temperature=0.0, prompt_logprobs=1)
            req = GenerateRequest(request_id="lp", token_ids=tuple(p), model=MODEL, sampling=sampling)
            stream = c.service.generate(req)
            async with contextlib.aclosing(stream):
                outs = [out async for out in stream]
            assert tokens(outs) == reference_output(p, 4, vocab_size=VOCAB)
            first = outs[0].prompt_logprobs
            assert first is not None and [e.token_id for e in first] == p[1:]
            assert all(o.prompt_logprobs is None for o in outs[1:])
            assert c.service.disagg is not None and c.service.disagg.choices == {"prompt_logprobs": 1}
            assert c.workers["d"].handoff.counters.pulled == 0  # type: ignore[union-attr]

    asyncio.run(main())


def test_no_prefill_worker_falls_back_or_fails_when_enforced() -> None:
    async def main() -> None:
        async with cluster(Routing(enforce_disagg=True)) as c:
            await c.add_worker("d", "decode", mock_engine())
            await c.wait_for(1)
            started = asyncio.get_running_loop().time()
            try:
                await c.generate("a", prompt(2, 9), 3)
            except NoWorkers as exc:
                assert "no_prefill_worker" in exc.message
                assert asyncio.get_running_loop().time() - started >= NO_PREFILL_WAIT_S  # it waited
            else:
                raise AssertionError("enforced disaggregation served a request locally")
        async with cluster(Routing()) as c:
            await c.add_worker("d", "both", mock_engine())
            await c.wait_for(1)
            p = prompt(2, 9)
            assert tokens(await c.generate("a", p, 3)) == reference_output(p, 3, vocab_size=VOCAB)

    asyncio.run(main())


def test_an_enforced_request_waits_for_a_prefill_worker_coming_back() -> None:
    """The prefill pool restarting (none alive for a moment): new requests wait for it."""

    async def main() -> None:
        async with cluster(Routing(enforce_disagg=True)) as c:
            await c.add_worker("d", "decode", mock_engine())
            await c.wait_for(1)
            p = prompt(3, 12)
            waiting = asyncio.create_task(c.generate("a", p, 3))
            await asyncio.sleep(0.5)
            assert not waiting.done()
            await c.add_worker("p", "prefill", mock_engine())
            assert tokens(await waiting) == reference_output(p, 3, vocab_size=VOCAB)
            assert c.service.disagg is not None and c.service.disagg.choices == {"enforced": 1}

    asyncio.run(main())


def test_prefill_worker_without_staging_falls_back_to_local_prefill() -> None:
    """A prefill worker that cannot stage (no agent on the decode side to pull with) still
    gives the first token; the decode worker computes the prompt itself, no duplicate."""

    async def main() -> None:
        async with cluster() as c:
            await c.add_worker("p", "prefill", mock_engine())
            await c.add_worker("d", "decode", mock_engine())
            await c.wait_for(2)
            c.agents["p"].close()  # staging now fails: the output carries no descriptor
            p = prompt(3, 21)
            assert tokens(await c.generate("a", p, 5)) == reference_output(p, 5, vocab_size=VOCAB)
            assert c.service.disagg is not None
            # the link loop may also check p -> d after its agent closed, and count that
            fallbacks = dict(c.service.disagg.fallbacks)
            assert fallbacks.pop("not_staged") == 1 and set(fallbacks) <= {"link_check_failed"}
            for wid in ("p", "d"):
                st = await c.control(wid, ControlRequest(op="check_integrity"))
                assert st.ok and st.kv_blocks_used == 0, st

    asyncio.run(main())


def test_prefill_worker_gone_falls_back_to_local_prefill() -> None:
    async def main() -> None:
        async with cluster() as c:
            await c.add_worker("p", "prefill", mock_engine())
            await c.add_worker("d", "decode", mock_engine())
            await c.wait_for(2)
            # The router still believes in "p", but its endpoint is gone.
            await c.workers["p"]._requests.unserve(c.workers["p"]._address)
            p = prompt(4, 13)
            outs = await c.generate("a", p, 5)
            assert tokens(outs) == reference_output(p, 5, vocab_size=VOCAB) and cached(outs) == {0}
            # prefilled where it decodes: the usage is that worker's own hit (3 blocks of 4)
            c.service.routers[MODEL].set_health("p", True)  # as if it had reported again
            assert cached(await c.generate("b", p, 5)) == {12}
            assert c.service.disagg is not None and c.service.disagg.fallbacks == {"prefill_failed": 2}

    asyncio.run(main())


def test_role_change_by_control_call() -> None:
    async def main() -> None:
        async with cluster(Routing()) as c:
            await c.add_worker("a", "both", mock_engine())
            await c.wait_for(1)
            reply = await c.control("a", ControlRequest(op="set_role", role="prefill", grace_s=1.0))
            assert reply.ok and reply.role == "prefill"
            await eventually(
                lambda: c.service.instance("a") is not None and c.service.instance("a").role == "prefill"
            )
            bad = await c.control("a", ControlRequest(op="set_role", role="boss"))
            assert not bad.ok and "unknown role" in bad.error

    asyncio.run(main())


def test_decode_worker_measures_its_link_to_the_prefill_worker() -> None:
    async def main() -> None:
        async with cluster() as c:
            await c.add_worker("p", "prefill", mock_engine())
            await c.add_worker("d", "decode", mock_engine())
            await c.wait_for(2)
            flow = c.service.disagg
            assert flow is not None
            await eventually(lambda: ("p", "d") in flow.links, timeout_s=10.0)
            link, _ = flow.links[("p", "d")]
            assert link.ok and link.bandwidth_bytes_per_s > 0 and link.rtt_s > 0

    asyncio.run(main())


def test_cancellations_at_every_stage_leave_no_block_and_no_payload() -> None:
    """Clients that leave before the first token, right after it (the transfer in flight) or
    mid-decode: both pools end intact and empty, and no staged payload or pull outlives its
    short timeout."""

    async def main() -> None:
        async with cluster() as c:
            # Pools large enough for all 120 at once: what is tested is that cancellations leave
            # nothing behind, not the 503 the router answers when the decode pool is full.
            await c.add_worker("p", "prefill", mock_engine(num_blocks=2048), transfer_timeout_s=1.0)
            await c.add_worker("d", "decode", mock_engine(num_blocks=2048), transfer_timeout_s=1.0)
            await c.wait_for(2)

            async def one(i: int) -> None:
                req = GenerateRequest(
                    request_id=f"c{i}",
                    token_ids=tuple(prompt(i, 10 + i % 50)),
                    model=MODEL,
                    sampling=SamplingParams(max_tokens=6, ignore_eos=True),
                )
                stream = c.service.generate(req)
                seen = 0
                async with contextlib.aclosing(stream):
                    async for out in stream:
                        seen += len(out.token_ids)
                        if seen >= i % 4:  # 0: before the first token is consumed, 1: at it, ...
                            return

            await asyncio.gather(*(one(i) for i in range(120)))
            assert c.service.disagg is not None and c.service.disagg.pending == {}
            for wid in ("p", "d"):
                for _ in range(100):
                    st = await c.control(wid, ControlRequest(op="check_integrity"))
                    if st.kv_blocks_used == 0 and st.live_transfers == 0:
                        break
                    await asyncio.sleep(0.05)
                assert st.ok and st.kv_blocks_used == 0 and st.live_transfers == 0, st

    asyncio.run(main())
