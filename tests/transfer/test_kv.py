"""Blocks of one mock runner's KV land in another's, over every transport."""

import numpy as np
import pytest

from interlock.engine.runners.mock import MockRunner
from interlock.transfer import TransferAgent, TransferState
from interlock.transfer.kv import import_when_done, stage_blocks


@pytest.fixture(scope="module")
def other():
    with TransferAgent() as a:
        yield a


@pytest.mark.parametrize("transport", ["inproc", "shm", "tcp"])
def test_blocks_move_between_runners(agent, other, transport):
    prefill, decode = MockRunner(num_blocks=32, timing=None), MockRunner(num_blocks=32, timing=None)
    prefill.kv[:] = np.arange(32 * 16, dtype=np.int32).reshape(32, 16)
    src, desc = stage_blocks(agent, prefill, [3, 9, 4], timeout_s=10)
    assert desc.nbytes == 3 * prefill.kv_block_nbytes
    dst = other.pull(desc, transport=transport, timeout_s=10)
    assert dst.finished_event.wait(10)
    assert import_when_done(dst, decode, [0, 1, 2]).state is TransferState.DONE
    assert (decode.kv[:3] == prefill.kv[[3, 9, 4]]).all()
    assert (decode.kv[3:] == -1).all()


def test_failed_export_aborts_the_source(agent):
    runner = MockRunner(num_blocks=4, timing=None)
    before = agent.num_live_sources()  # the agent is shared: earlier tests' sources may still live
    with pytest.raises(IndexError):
        stage_blocks(agent, runner, [7])
    assert agent.num_live_sources() <= before


def test_nothing_is_imported_while_pending(agent):
    decode = MockRunner(num_blocks=4, timing=None)

    class Pending:
        def poll(self):
            from interlock.transfer.base import PENDING

            return PENDING

    assert import_when_done(Pending(), decode, [0]).state is TransferState.PENDING  # type: ignore[arg-type]
    assert (decode.kv == -1).all()
