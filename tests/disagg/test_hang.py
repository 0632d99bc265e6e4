"""A prefill worker hangs (SIGSTOP) mid-transfer under load, then resumes (SIGCONT).

300 requests through 2 prefill + 1 decode worker processes (mock runner, enforced
disaggregation, 16 at a time). A third of the way, one prefill worker is stopped for 8 s, with
prefills and KV hand-offs of its own in flight. Every request completes with the reference
tokens (a prefill that hangs falls back to the decode worker; a pull from the hung worker times
out and the decode worker computes the prompt); nothing is refused; after SIGCONT the worker
rejoins and prefills again; every block pool is intact with nothing left in use.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time

import pytest

from interlock.deploy import Routing
from interlock.protocol.control import ControlRequest
from tests.disagg.procs import proc_cluster
from tests.disagg.test_kill import MOCK, flow_summary, one

pytestmark = pytest.mark.slow

N = 300
CONCURRENCY = 16
HANG_S = 8.0


def test_a_prefill_worker_stopped_mid_transfer_fails_no_request_and_rejoins() -> None:
    async def main() -> None:
        async with proc_cluster(Routing(enforce_disagg=True)) as c:
            for wid, role in (("p0", "prefill"), ("p1", "prefill"), ("d0", "decode")):
                c.spawn(wid, role, *MOCK)
            await c.wait_for(3)
            model = c.service.models()[0].name
            rng = random.Random(11)
            sem = asyncio.Semaphore(CONCURRENCY)
            done = 0
            stopped_at: list[float] = []
            pid = c.procs["p1"].pid
            router = c.service.routers[model]

            async def run(i: int) -> str:
                nonlocal done
                async with sem:
                    r = await one(c, i, rng, model)
                    done += 1
                    if done == N // 3:
                        os.kill(pid, signal.SIGSTOP)
                        stopped_at.append(time.monotonic())
                        asyncio.get_running_loop().call_later(HANG_S, os.kill, pid, signal.SIGCONT)
                    return r

            before = router.metrics.decisions
            results = await asyncio.gather(*(run(i) for i in range(N)))
            counts = {r: results.count(r) for r in sorted(set(results))}
            print(
                counts, flow_summary(c), f"{time.monotonic() - stopped_at[0]:.1f} s from SIGSTOP to the end"
            )
            assert set(counts) <= {"ok", "cancelled"}, counts
            assert router.metrics.decisions > before
            # p1 back: in discovery again and prefilling (a few more requests to show it).
            deadline = time.monotonic() + 60
            while c.service.instance("p1") is None or not router.is_eligible("p1"):
                assert time.monotonic() < deadline, "p1 never rejoined"
                await asyncio.sleep(0.2)
            extra = [await one(c, N + i, rng, model) for i in range(12)]
            assert set(extra) <= {"ok", "cancelled"}, (extra, flow_summary(c))
            for wid in ("p0", "p1", "d0"):
                for _ in range(300):  # staged payloads nobody pulled time out (3 s; a hung one later)
                    st = await c.control(wid, ControlRequest(op="check_integrity"))
                    if st.kv_blocks_used == 0 and st.live_transfers == 0:
                        break
                    await asyncio.sleep(0.1)
                assert st.ok and not st.integrity_error, (wid, st)
                assert st.kv_blocks_used == 0 and st.live_transfers == 0, (wid, st)

    asyncio.run(main())
