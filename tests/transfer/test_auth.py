"""KV transfer connections with a cluster secret: a peer without it can neither pull a staged
payload (a user's prompt, as KV) nor pose as a source, nor run a link check."""

from __future__ import annotations

import socket

import pytest

from interlock.errors import TransferError
from interlock.transfer import TransferAgent, TransferState, measure_link
from interlock.transfer import frames as fr
from interlock.transfer.tcp import split_address

SECRET = b"cluster-secret-for-tests-0123456789"
DATA = b"the user's prompt, as KV" * 100


def _pull(agent: TransferAgent, descriptor):  # type: ignore[no-untyped-def]
    dst = agent.pull(descriptor, transport="tcp", timeout_s=5)
    assert dst.finished_event.wait(5)
    return dst


@pytest.fixture(scope="module")
def secured():
    with TransferAgent(cluster_secret=SECRET, tick_s=0.05) as a:
        yield a


def _offer(agent: TransferAgent):  # type: ignore[no-untyped-def]
    src = agent.create_source(len(DATA), timeout_s=10)
    src.buffer[:] = DATA
    return src, src.publish()


def test_peers_with_the_secret_transfer(secured):
    with TransferAgent(cluster_secret=SECRET) as peer:
        _, descriptor = _offer(secured)
        dst = _pull(peer, descriptor)
        assert dst.poll().state is TransferState.DONE and bytes(dst.payload) == DATA
        dst.release()


@pytest.mark.parametrize("attacker_secret", [None, b"a-wrong-secret-of-enough-length"])
def test_a_puller_without_the_secret_gets_nothing(secured, attacker_secret):
    src, descriptor = _offer(secured)
    refused = secured._server.refused
    with TransferAgent(cluster_secret=attacker_secret) as attacker:
        dst = _pull(attacker, descriptor)
        assert dst.poll().state is TransferState.FAILED
        with pytest.raises(Exception):  # noqa: B017 - no payload of any kind
            bytes(dst.payload)
    assert secured._server.refused == refused + 1
    assert not src.poll().finished  # still there for the real destination
    with TransferAgent(cluster_secret=SECRET) as real:
        dst = _pull(real, descriptor)
        assert bytes(dst.payload) == DATA
        dst.release()


def test_a_raw_pull_frame_is_never_answered(secured):
    src, descriptor = _offer(secured)
    with socket.create_connection(split_address(secured.tcp_address), timeout=5) as sock:
        try:
            fr.send_frame(sock, fr.Pull(descriptor.transfer_id))
            sock.sendall(b"\0" * 64)  # whatever it takes to fill a hello and a response
        except (BrokenPipeError, ConnectionResetError):
            pass  # already dropped
        assert _read_to_close(sock) == b""  # closed: no Ready, no payload
    assert not src.poll().finished
    src.abort()


def _read_to_close(sock: socket.socket) -> bytes:
    got = b""
    try:
        while chunk := sock.recv(1 << 16):
            got += chunk
    except (ConnectionResetError, BrokenPipeError):
        pass  # closed with our bytes unread
    return got


def test_a_fake_source_is_refused_before_the_pull(secured):
    """A descriptor pointing at an agent without the secret: the puller drops it."""
    with TransferAgent() as impostor:
        _, descriptor = _offer(impostor)
        dst = _pull(secured, descriptor)
        assert dst.poll().state is TransferState.FAILED
        assert impostor.num_live_sources() == 1  # it never saw a Pull


def test_a_link_check_needs_the_secret(secured):
    with TransferAgent() as attacker, pytest.raises(TransferError, match="link check"):
        measure_link(
            attacker, secured.tcp_address, block_nbytes=1024, num_blocks=1, repeats=1, pings=1, timeout_s=2
        )
    with TransferAgent(cluster_secret=SECRET) as peer:
        stats = measure_link(
            peer,
            secured.tcp_address,
            transport="tcp",
            block_nbytes=1024,
            num_blocks=1,
            repeats=1,
            pings=2,
            timeout_s=5,
        )
        assert stats.bandwidth_bytes_per_s > 0 and stats.rtt_s > 0
