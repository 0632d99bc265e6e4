import socket

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
