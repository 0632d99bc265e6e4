"""Shared memory across processes when a peer is SIGKILLed: bounded failure, nothing leaked."""

import time

import msgspec

from interlock.transfer import TransferAgent, TransferState
from interlock.transfer.staging import list_segments
from tests.transfer import peers


def _agent_peer(spawn):
    peer = spawn(peers.agent_peer)
    assert peer.recv()[0] == "ready"
    return peer


def _wait_end(transfer, wait_s: float = 5.0):
    deadline = time.monotonic() + wait_s
    while not transfer.poll().finished and time.monotonic() < deadline:
        time.sleep(0.005)
    return transfer.poll()


def test_destination_killed_while_holding_the_payload(spawn, agent, own_segments):
    peer = _agent_peer(spawn)
    src = agent.create_source(1 << 20, timeout_s=30)
    desc = src.publish()
    assert peer.call("pull", msgspec.msgpack.encode(desc), "shm", True)[0] == "done"
    assert src.poll().state is TransferState.PENDING  # claimed, not yet released
    peer.kill()
    status = _wait_end(src)
    assert status.state is TransferState.FAILED and status.reason == "destination process died"
    assert own_segments() == []


def test_source_killed_before_the_pull(spawn, agent):
    peer = _agent_peer(spawn)
    desc = peer.offer(1 << 20, seed=1, timeout_s=30)
    assert list_segments(peer.pid) == [desc.shm_name]
    peer.kill()
    dst = agent.pull(desc, timeout_s=5)
    assert dst.transport == "shm"
    assert dst.poll().reason == "source process died"  # also where another agent swept it first
    assert list_segments(peer.pid) == []  # the failed pull unlinked the orphan


def test_source_killed_over_tcp(spawn, agent):
    peer = _agent_peer(spawn)
    desc = peer.offer(1 << 20, seed=1, timeout_s=30)
    peer.kill()
    status = _wait_end(agent.pull(desc, transport="tcp", timeout_s=5))
    assert status.state is TransferState.FAILED
    TransferAgent().close()  # any agent's start sweeps the dead source's segment
    assert list_segments(peer.pid) == []


def test_orphans_are_swept_by_housekeeping(spawn):
    with TransferAgent(tick_s=0.02, sweep_s=0.05):
        peer = _agent_peer(spawn)
        peer.offer(4096, seed=2, timeout_s=30)
        assert len(list_segments(peer.pid)) == 1
        peer.kill()
        deadline = time.monotonic() + 5
        while list_segments(peer.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert list_segments(peer.pid) == []


def test_destination_abort_reaches_the_source_in_another_process(remote, agent):
    desc = remote.offer(1000, seed=3)
    dst = agent.pull(desc, transport="shm")
    assert dst.poll().state is TransferState.DONE
    dst.abort()
    assert remote.call("status", desc.transfer_id, 5.0) == ("failed", "aborted by destination")
    assert remote.call("segments") == []
