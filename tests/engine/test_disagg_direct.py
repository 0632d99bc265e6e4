"""The one copy between two workers of a host (in-process deployment, mock engines): the
prefill worker's KV cache is shared (a memfd), the decode worker maps it and copies the blocks
straight into its own, and the prefill side exports nothing; where the one copy cannot be had
(a layout of another kind, a cache it cannot open) the staged payload is pulled instead; a
payload of another layout (fp16 against bf16: the same bytes per block) is refused and the
prompt computed. Each time: the reference output, the path counted, and no block or transfer
left on either side."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from interlock.engine.runners.mock import MockRunner, reference_output
from interlock.protocol.control import ControlRequest
from interlock.protocol.transfer import SharedCacheRegion
from tests.disagg.cluster import Cluster, cluster, mock_engine, tokens
from tests.engine.conftest import VOCAB

PROMPT = [3 + (i * 104729) % (VOCAB - 3) for i in range(77)]  # 20 blocks of 4 tokens


class OtherDtype(MockRunner):
    """Says its shared cache holds another dtype (same bytes per block)."""

    def shared_region(self) -> SharedCacheRegion | None:
        region = super().shared_region()
        return None if region is None else msgspec.structs.replace(region, dtype="mock-int16")


class OtherPayload(MockRunner):
    """Says its exported blocks hold another dtype (same bytes per block)."""

    def kv_layout(self) -> tuple[int, int, str]:
        piece, pieces, _ = super().kv_layout()
        return (piece, pieces, "mock-int16")


class Unopenable(MockRunner):
    """Names a descriptor of its process that is not open (as /proc refusing the open)."""

    def shared_region(self) -> SharedCacheRegion | None:
        region = super().shared_region()
        return None if region is None else msgspec.structs.replace(region, fd=(1 << 20) - 1)


async def _clean(c: Cluster) -> None:
    """No block or transfer left on either side (the source frees its blocks once it sees
    DONE, a moment after the output ends)."""
    for wid in ("p", "d"):
        deadline = asyncio.get_running_loop().time() + 5.0
        while True:
            st = await c.control(wid, ControlRequest(op="check_integrity"))
            if st.ok and st.kv_blocks_used == 0 and st.live_transfers == 0:
                break
            assert asyncio.get_running_loop().time() < deadline, st
            await asyncio.sleep(0.01)


def _run(
    prefill_runner: type[MockRunner], *, n: int = 3, transport: str = "auto", chunk_blocks: int = 0
) -> tuple[dict[str, int], int, int, int]:
    """``n`` requests p -> d (``transport``: the decode worker's ``cache_transport``); (d's
    pulls by transport, d's refused one-copies, p's one copies served, d's mapped caches)."""

    async def main() -> tuple[dict[str, int], int, int, int]:
        async with cluster() as c:
            await c.add_worker("p", "prefill", mock_engine(shared=True, runner_class=prefill_runner))
            await c.add_worker("d", "decode", mock_engine(), transport=transport)
            await c.wait_for(2)
            hp, hd = c.workers["p"].handoff, c.workers["d"].handoff
            assert hp is not None and hd is not None
            if chunk_blocks:  # the decode worker copies that many blocks per engine call
                hd.chunk_bytes = chunk_blocks * c.workers["d"].engine.core.runner.kv_block_nbytes
            for i in range(n):
                prompt = PROMPT[i:] + PROMPT[:i]
                outs = await c.generate(f"r{i}", prompt, 6)
                assert tokens(outs) == reference_output(prompt, 6, vocab_size=VOCAB)
            await _clean(c)
            assert hd.counters.pulled == n and hd.counters.pull_failed == 0
            return (
                dict(hd.counters.transports),
                hd.counters.direct_refused,
                hp.counters.direct_served,
                len(hd.views),
            )

    return asyncio.run(main())


@pytest.mark.parametrize("chunk_blocks", [0, 3])
def test_the_decode_worker_copies_straight_from_the_prefill_cache(chunk_blocks: int) -> None:
    transports, refused, served, views = _run(MockRunner, chunk_blocks=chunk_blocks)
    assert transports == {"direct": 3} and refused == 0 and served == 3
    assert views == 1  # one mapping per source, kept across its transfers


def test_a_cache_of_another_layout_is_pulled_staged() -> None:
    transports, refused, served, _ = _run(OtherDtype)
    assert transports == {"inproc": 3} and refused == 3 and served == 0


def test_a_cache_that_cannot_be_opened_is_pulled_staged() -> None:
    transports, refused, served, views = _run(Unopenable)
    assert transports == {"inproc": 3} and refused == 3 and served == 0 and views == 0


def test_a_decode_worker_with_a_forced_transport_pulls_staged_and_the_source_exports_then() -> None:
    """The source exports only once a staged claim arrives (here over TCP)."""
    transports, refused, served, views = _run(MockRunner, transport="tcp")
    assert transports == {"tcp": 3} and refused == 0 and served == 0 and views == 0


def test_a_payload_of_another_layout_is_refused_and_the_prompt_computed() -> None:
    async def main() -> None:
        async with cluster() as c:
            await c.add_worker("p", "prefill", mock_engine(runner_class=OtherPayload))
            await c.add_worker("d", "decode", mock_engine())
            await c.wait_for(2)
            hd = c.workers["d"].handoff
            assert hd is not None
            for i in range(2):
                prompt = PROMPT[i:] + PROMPT[:i]
                outs = await c.generate(f"r{i}", prompt, 6)
                assert tokens(outs) == reference_output(prompt, 6, vocab_size=VOCAB)
            await _clean(c)
            assert (
                hd.counters.layout_refused == 2 and hd.counters.pulled == 0 and hd.counters.pull_failed == 2
            )

    asyncio.run(main())
