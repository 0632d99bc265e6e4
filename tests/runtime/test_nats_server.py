import os
import signal
import socket
import time

import pytest

from interlock.runtime import NatsServer
from interlock.runtime.nats_server import find_binary


def test_binary_comes_from_the_package() -> None:
    assert find_binary().name == "nats-server"


def test_starts_on_a_free_port_and_stops() -> None:
    server = NatsServer().start()
    try:
        assert server.port > 0 and server.url == f"nats://127.0.0.1:{server.port}"
        with socket.create_connection(("127.0.0.1", server.port), timeout=1) as sock:
            assert sock.recv(4) == b"INFO"
        process = server._process
        assert process is not None
    finally:
        server.stop()
    assert process.poll() is not None
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=1).close()


def test_restart_after_a_crash_reuses_the_port() -> None:
    server = NatsServer().start()
    try:
        port, first = server.port, server.pid
        assert first is not None and server.alive
        os.kill(first, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while server.alive and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not server.alive
        server.restart()
        assert server.alive and server.port == port and server.pid != first
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            assert sock.recv(4) == b"INFO"
    finally:
        server.stop()
    assert not server.alive and server.pid is None


def test_restart_of_a_running_server_replaces_it() -> None:
    with NatsServer() as server:
        old = server._process
        server.restart()
        assert old is not None and old.poll() is not None
        assert server.alive and server._process is not old


def test_start_twice_is_refused() -> None:
    with NatsServer() as server, pytest.raises(RuntimeError, match="already started"):
        server.start()
