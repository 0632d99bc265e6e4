"""TCP transport against stalled and killed peers: polls stay instant, ends are bounded."""

import os
import time

from interlock.protocol.transfer import TransferDescriptor
from interlock.transfer import TransferState
from tests.transfer import peers
from tests.transfer.conftest import connection_fd_targets

BIG = 64 << 20
"""Far more than loopback socket buffers hold, so a stalled reader blocks the sender."""


def _descriptor(address: str, nbytes: int) -> TransferDescriptor:
    return TransferDescriptor(
        transfer_id="t", nbytes=nbytes, agent_id="elsewhere", host_id="elsewhere", pid=1, tcp_address=address
    )


def _poll_until_end(transfer, wait_s: float):
    """Polls like an engine step loop; returns (status, slowest poll in seconds)."""
    slowest, deadline = 0.0, time.monotonic() + wait_s
    while time.monotonic() < deadline:
        t0 = time.perf_counter()
        status = transfer.poll()
        slowest = max(slowest, time.perf_counter() - t0)
        if status.finished:
            return status, slowest
        time.sleep(0.005)
    return transfer.poll(), slowest


def _stalled_source(spawn, agent, timeout_s: float):
    """Returns the peer, the pull, and the sockets this process held before the pull."""
    peer = spawn(peers.stalled_source, BIG)
    address = peer.recv()
    sockets_before = connection_fd_targets()
    dst = agent.pull(_descriptor(address, BIG), transport="tcp", timeout_s=timeout_s)
    assert peer.recv() == "stalled"
    return peer, dst, sockets_before


def test_stalled_source_times_out_and_polls_never_block(spawn, agent):
    _, dst, sockets_before = _stalled_source(spawn, agent, timeout_s=1.0)
    status, slowest = _poll_until_end(dst, wait_s=10)
    assert status.state is TransferState.FAILED and status.reason.startswith("timeout")
    assert slowest < 0.5  # a non-blocking check with a huge margin, not a speed claim
    _wait_sockets_back_to(sockets_before)


def test_source_killed_mid_transfer_fails_the_destination_fast(spawn, agent):
    peer, dst, sockets_before = _stalled_source(spawn, agent, timeout_s=30.0)
    assert dst.poll().state is TransferState.PENDING
    peer.kill()
    status, _ = _poll_until_end(dst, wait_s=10)
    assert status.state is TransferState.FAILED and "source disconnected" in status.reason
    _wait_sockets_back_to(sockets_before)


def test_destination_abort_mid_transfer(spawn, agent):
    _, dst, sockets_before = _stalled_source(spawn, agent, timeout_s=30.0)
    dst.abort()
    assert dst.poll().reason == "aborted by destination"
    _wait_sockets_back_to(sockets_before)


def _stalled_dest(spawn, agent, timeout_s: float):
    src = agent.create_source(BIG, timeout_s=timeout_s)
    desc = src.publish()
    peer = spawn(peers.stalled_dest, agent.tcp_address, desc.transfer_id)
    assert peer.recv() == "stalled"
    return peer, src


def test_destination_killed_mid_transfer_fails_the_source_fast(spawn, agent, own_segments):
    sockets_before = connection_fd_targets()
    peer, src = _stalled_dest(spawn, agent, timeout_s=30.0)
    pipe = os.readlink(f"/proc/self/fd/{peer.conn.fileno()}")
    assert src.poll().state is TransferState.PENDING
    peer.kill()
    status, slowest = _poll_until_end(src, wait_s=10)
    assert status.state is TransferState.FAILED and "destination disconnected" in status.reason
    assert slowest < 0.5
    assert own_segments() == []
    _wait_sockets_back_to(sockets_before | {pipe})  # the server closed its side


def test_stalled_destination_times_out_the_source(spawn, agent, own_segments):
    _, src = _stalled_dest(spawn, agent, timeout_s=1.0)
    status, slowest = _poll_until_end(src, wait_s=10)
    assert status.state is TransferState.FAILED
    assert slowest < 0.5
    assert own_segments() == []


def test_source_abort_mid_transfer(spawn, agent, own_segments):
    _, src = _stalled_dest(spawn, agent, timeout_s=30.0)
    src.abort()
    assert src.poll().reason == "aborted by source"
    assert own_segments() == []


def test_unreachable_source_fails(agent):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"  # bound, never listening: refused
    status, _ = _poll_until_end(agent.pull(_descriptor(address, 10), transport="tcp", timeout_s=5), 10)
    assert status.state is TransferState.FAILED


def _wait_sockets_back_to(before: set[str], wait_s: float = 5.0) -> None:
    deadline = time.monotonic() + wait_s
    while connection_fd_targets() - before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert connection_fd_targets() - before == set()
