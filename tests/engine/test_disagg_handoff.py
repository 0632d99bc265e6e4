"""A streamed KV handoff between two workers (in-process deployment, mock engines): the prefill
side publishes, then exports block by block (slowly here), and the decode side imports the
blocks that arrived while the rest is still being exported; the output is the reference and
no block is left behind on either side."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from interlock.engine.clock import RealClock
from interlock.engine.core import EngineCore
from interlock.engine.runners.mock import MockRunner, reference_output
from interlock.protocol.control import ControlRequest
from tests.disagg.cluster import cluster, mock_engine, tokens
from tests.engine.conftest import EOS, VOCAB, make_config


class SlowExport(MockRunner):
    """Each export call takes a while: the decode side sees the payload arrive chunk by chunk."""

    def export_blocks(self, block_ids: Sequence[int], out: memoryview) -> None:
        time.sleep(0.02)
        super().export_blocks(block_ids, out)


def slow_prefill_engine() -> EngineCore:
    config = make_config(num_blocks=256, block_size=4, max_num_batched_tokens=32)
    runner = SlowExport(num_blocks=256, block_size=4, vocab_size=VOCAB, eos_token_ids=(EOS,), timing=None)
    return EngineCore(config, runner, clock=RealClock())


def test_blocks_are_imported_while_the_prefill_worker_still_exports() -> None:
    prompt = [3 + (i * 104729) % (VOCAB - 3) for i in range(77)]  # 20 blocks of 4 tokens

    async def main() -> None:
        async with cluster() as c:
            prefill = slow_prefill_engine()
            await c.add_worker("p", "prefill", prefill)
            await c.add_worker("d", "decode", mock_engine())
            await c.wait_for(2)
            handoff_p, handoff_d = c.workers["p"].handoff, c.workers["d"].handoff
            assert handoff_p is not None and handoff_d is not None
            handoff_p.chunk_bytes = prefill.runner.kv_block_nbytes  # one block per chunk
            outs = await c.generate("r", prompt, 6)
            assert tokens(outs) == reference_output(prompt, 6, vocab_size=VOCAB)
            assert handoff_d.counters.pulled == 1 and handoff_d.counters.pull_failed == 0
            assert 0 < handoff_d.counters.blocks_streamed < 20  # some before DONE, the rest on it
            for wid in ("p", "d"):
                st = await c.control(wid, ControlRequest(op="check_integrity"))
                assert st.ok and st.kv_blocks_used == 0, st

    asyncio.run(main())
