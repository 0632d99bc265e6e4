"""The identity test over worker processes: the one copy, then TCP.

``interlock worker`` processes (SmolLM2, fp32, one thread, 64-token prefill budget) over a
private nats-server. Phase 1: A prefills (its KV cache on a memfd: ``shared_kv_cache``'s
default for a CPU prefill worker), B decodes (``auto``) -> every pull is the one copy, B copying
straight from A's cache (``direct``). Phase 2: A becomes a decode worker by a control call and C joins as the
prefill worker with ``--cache-transport tcp`` (it stages in private memory, so every peer pulls
from it over TCP) -> every pull, by A or B, is TCP. Both phases must equal the aggregated
engine's greedy tokens.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from interlock.deploy import Routing
from interlock.protocol import GenerateRequest, SamplingParams
from interlock.protocol.control import ControlRequest
from tests.disagg.procs import ProcCluster, proc_cluster
from tests.disagg.test_identity import BUDGET, MAX_TOKENS

pytestmark = pytest.mark.slow

TORCH = (
    "--runner",
    "torch",
    "--dtype",
    "float32",
    "--threads",
    "1",
    "--block-size",
    "16",
    "--num-blocks",
    "256",
    "--max-num-batched-tokens",
    str(BUDGET),
    "--max-model-len",
    "1024",
)


async def run_all(c: ProcCluster, prompts: list[list[int]], tag: str) -> list[list[int]]:
    model = c.service.models()[0].name
    got = []
    for i, p in enumerate(prompts):
        req = GenerateRequest(
            request_id=f"{tag}{i}",
            token_ids=tuple(p),
            model=model,
            sampling=SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0),
        )
        stream = c.service.generate(req)
        async with contextlib.aclosing(stream):
            got.append([t async for out in stream for t in out.token_ids])
    return got


async def wait_role(c: ProcCluster, wid: str, role: str) -> None:
    for _ in range(200):
        info = c.service.instance(wid)
        if info is not None and info.role == role:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{wid} never re-joined as {role}")


def test_disaggregated_equals_aggregated_over_shm_and_tcp(
    expected: list[list[int]], prompts: list[list[int]]
) -> None:
    async def main() -> None:
        async with proc_cluster(Routing(enforce_disagg=True)) as c:
            c.spawn("a", "prefill", *TORCH, "--kv-transfer", "auto")
            c.spawn("b", "decode", *TORCH, "--cache-transport", "auto")
            await c.wait_for(2, timeout_s=180.0)
            assert await run_all(c, prompts, "shm") == expected
            assert (await c.control("b", ControlRequest(op="status"))).pulls_by_transport == {
                "direct": len(prompts)
            }

            assert (await c.control("a", ControlRequest(op="set_role", role="decode"))).ok
            await wait_role(c, "a", "decode")
            c.spawn("c", "prefill", *TORCH, "--cache-transport", "tcp")
            await c.wait_for(3, timeout_s=180.0)
            assert await run_all(c, prompts, "tcp") == expected
            pulls = [(await c.control(w, ControlRequest(op="status"))).pulls_by_transport for w in ("a", "b")]
            assert pulls[0].get("tcp", 0) + pulls[1].get("tcp", 0) == len(prompts)
            assert pulls[1].get("direct") == len(prompts) and "direct" not in pulls[0]
            for wid in ("a", "b", "c"):
                st = await c.control(wid, ControlRequest(op="check_integrity"))
                assert st.ok and st.kv_blocks_used == 0, st

    asyncio.run(main())
