"""Buffer reuse: recycled segments never hand a destination stale bytes, and nothing outlives
its agent."""

import msgspec
import pytest

from interlock.transfer import TransferAgent, TransferState
from interlock.transfer.pool import RecvPool, SegmentPool, size_class
from interlock.transfer.staging import list_segments
from tests.transfer import peers


def test_size_classes_waste_at_most_a_quarter():
    for n in [0, 1, 65536, 65537, 1 << 20, (1 << 20) + 1, 67_092_480, 3 * (1 << 30) + 5]:
        c = size_class(n)
        assert c >= n and (n <= 65536 or c <= n * 1.25)


def test_segment_pool_reuses_best_fit_and_respects_its_bound(own_segments):
    pool = SegmentPool(4 << 20, shared=True)
    a = pool.take(1 << 20)
    pool.give(a)
    assert pool.take(900_000) is a  # fits within its class
    pool.give(a)
    other = pool.take(3 << 20)
    assert other is not a  # too small: a new one
    other.release()
    big = pool.take(8 << 20)
    pool.give(big)  # over the bound: unlinked, not kept
    assert big.name not in own_segments()
    pool.close()
    assert a.name not in own_segments()


def test_recv_pool_without_budget_keeps_nothing():
    pool = RecvPool(0)
    buf = pool.take(10)
    pool.give(buf)
    assert pool.take(10) is not buf


@pytest.mark.parametrize("transport", ["inproc", "shm", "tcp"])
def test_reused_buffers_carry_each_payload_exactly(transport, own_segments):
    with TransferAgent() as src_agent, TransferAgent() as dst_agent:
        names = set()
        for i in range(6):
            data = peers.payload(200_000 - i, seed=i)  # same class, different sizes and bytes
            src = src_agent.create_source(len(data))
            src.buffer[:] = data
            desc = src.publish()
            names.add(desc.shm_name)
            dst = dst_agent.pull(desc, transport=transport)
            assert dst.finished_event.wait(10)
            assert bytes(dst.payload) == data
            dst.release()
            while not src.poll().finished:
                pass
            assert src.poll().state is TransferState.DONE
        assert len(names) == 1  # one segment served all six
    assert own_segments() == []


def test_reuse_across_processes_and_clean_exit(spawn, agent, own_segments):
    peer = spawn(peers.agent_peer, 1 << 30)
    assert peer.recv()[0] == "ready"
    with TransferAgent() as pooled:
        names = set()
        for i in range(4):
            desc = peer.offer(300_000, seed=i)
            names.add(desc.shm_name)
            dst = pooled.pull(desc)
            assert dst.transport == "shm" and bytes(dst.payload) == peers.payload(300_000, i)
            dst.release()
            assert peer.call("status", desc.transfer_id, 5.0) == ("done", "")
        assert len(names) == 1
        src = pooled.create_source(5000)
        src.buffer[:] = peers.payload(5000, 9)
        reply = peer.call("pull", msgspec.msgpack.encode(src.publish()), "shm", False)
        assert reply == ("done", "", peers.digest(peers.payload(5000, 9)))
    peer.stop(graceful=True)
    assert list_segments(peer.pid) == []
    assert own_segments() == []
