"""The handshake gate: unauthenticated connections cost no thread, are bounded in number and
time, and their refusals are logged as a count, not a line each."""

from __future__ import annotations

import logging
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from interlock.protocol.handshake import CHALLENGE_SIZE, ClientHandshake
from interlock.transfer import TransferAgent, TransferState
from interlock.transfer import frames as fr
from interlock.transfer.gate import MAX_PENDING, Gate, RefusalLog
from interlock.transfer.tcp import split_address

SECRET = b"cluster-secret-for-tests-0123456789"
DATA = b"the user's prompt, as KV" * 100


def test_refusals_are_logged_first_in_full_then_as_one_count_per_interval() -> None:
    log = RefusalLog(interval_s=10.0)
    assert log.refused("from a: bad", now=0.0) == ["KV transfer: refused a connection from a: bad"]
    assert [log.refused(f"from {i}: bad", now=1.0 + i / 100) for i in range(299)] == [[]] * 299
    assert log.flush(now=9.9) == []
    assert log.flush(now=10.0) == [
        "KV transfer: refused 299 more connection(s) since the last report (latest from 298: bad)"
    ]
    assert log.refused("from b: late", now=15.0) == []  # inside the interval the count opened
    assert log.flush(now=19.9) == []
    assert log.refused("from c: later", now=21.0) == [
        "KV transfer: refused 1 more connection(s) since the last report (latest from b: late)"
    ]
    assert log.flush(now=31.0) == [
        "KV transfer: refused 1 more connection(s) since the last report (latest from c: later)"
    ]
    assert log.flush(now=45.0) == []  # a quiet interval writes nothing
    assert log.refused("from d: after a quiet spell", now=200.0) == [
        "KV transfer: refused a connection from d: after a quiet spell"
    ]


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        yield sock


def _connect(listener: socket.socket) -> socket.socket:
    return socket.create_connection(listener.getsockname(), timeout=5)


def _poll_until(gate: Gate, done: Callable[[list[socket.socket]], bool]) -> list[socket.socket]:
    passed: list[socket.socket] = []
    deadline = time.monotonic() + 10
    while not done(passed):
        assert time.monotonic() < deadline, "the gate never got there"
        passed += gate.poll(0.01)
    return passed


def _readable(sock: socket.socket) -> bool:
    return bool(select.select([sock], [], [], 0)[0])


def _closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_a_connection_passes_after_its_proof_with_its_first_frame_unread(listener: socket.socket) -> None:
    gate = Gate(listener, SECRET)
    with _connect(listener) as client:
        hs = ClientHandshake(SECRET)
        client.sendall(hs.hello())
        assert _poll_until(gate, lambda _: _readable(client)) == []  # the challenge, not a pass
        challenge = client.recv(CHALLENGE_SIZE, socket.MSG_WAITALL)
        client.sendall(hs.answer(challenge))
        fr.send_frame(client, fr.Ping())  # at once, as a real client does
        [conn] = _poll_until(gate, lambda passed: bool(passed))
        with conn:
            conn.settimeout(5)
            assert fr.recv_frame(conn) == fr.Ping() and gate.refused == 0 and gate.num_pending == 0
    gate.close()


def test_without_a_secret_a_connection_passes_on_its_first_bytes(listener: socket.socket) -> None:
    gate = Gate(listener, None)
    with _connect(listener) as silent, _connect(listener) as talker:
        _poll_until(gate, lambda _: gate.num_pending == 2)
        fr.send_frame(talker, fr.Ping())
        [conn] = _poll_until(gate, lambda passed: bool(passed))
        with conn:
            conn.settimeout(5)
            assert fr.recv_frame(conn) == fr.Ping() and gate.num_pending == 1
        assert silent.fileno() >= 0
    gate.close()


def test_past_the_cap_the_oldest_waiting_connection_is_pushed_out(listener: socket.socket) -> None:
    gate = Gate(listener, SECRET, max_pending=2)
    clients = [_connect(listener) for _ in range(3)]
    _poll_until(gate, lambda _: gate.refused == 1)
    assert gate.num_pending == 2 and _closed_by_peer(clients[0])
    for client in clients:
        client.close()
    gate.close()


def test_the_cap_holds_at_least_one_connection(listener: socket.socket) -> None:
    with pytest.raises(ValueError, match="max_pending"):
        Gate(listener, SECRET, max_pending=0)


def test_a_silent_connection_is_dropped_at_its_deadline(listener: socket.socket) -> None:
    gate = Gate(listener, SECRET, timeout_s=0.05)
    with _connect(listener) as client:
        _poll_until(gate, lambda _: gate.refused == 1)
        assert gate.num_pending == 0 and _closed_by_peer(client)
    gate.close()


def test_a_flood_of_unauthenticated_connections_costs_no_thread_and_a_real_transfer_gets_through(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="interlock.transfer")
    with (
        TransferAgent(cluster_secret=SECRET, tick_s=0.05) as agent,
        TransferAgent(cluster_secret=SECRET) as peer,
    ):
        threads_before = threading.active_count()
        address = split_address(agent.tcp_address)
        flood = [socket.create_connection(address, timeout=5) for _ in range(300)]
        try:
            for i, sock in enumerate(flood):
                if i % 3 == 0:
                    sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # not a hello: refused at once
                elif i % 3 == 1:
                    sock.sendall(ClientHandshake(b"a-wrong-secret-of-enough-length").hello())  # then silence
            deadline = time.monotonic() + 10
            while agent._server.refused < 100:  # the 100 bad hellos, at least
                assert time.monotonic() < deadline, agent._server.refused
                time.sleep(0.01)
            # Before the gate, each of these connections held a thread until its timeout.
            assert threading.active_count() <= threads_before + 2
            assert agent._server.num_pending <= MAX_PENDING

            src = agent.create_source(len(DATA), timeout_s=10)
            src.buffer[:] = DATA
            dst = peer.pull(src.publish(), transport="tcp", timeout_s=10)
            assert dst.finished_event.wait(10)
            assert dst.poll().state is TransferState.DONE and bytes(dst.payload) == DATA
            dst.release()
        finally:
            for sock in flood:
                sock.close()
    refusals = [r for r in caplog.records if "refused" in r.getMessage()]
    assert 1 <= len(refusals) <= 3  # the first in full, then counts (one per 10 s at most)
