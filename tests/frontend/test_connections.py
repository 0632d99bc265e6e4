"""Connection limits: idle, slow-header and slow-body timeouts, and the cap on open connections."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from interlock.frontend import FakeScript, FrontendConfig
from tests.certs import needs_openssl, self_signed
from tests.frontend.conftest import MODEL, Served, serving

TIMEOUT = 0.5
CAP = 6


@pytest.fixture(scope="module")
def limited(smol_path: Path) -> Iterator[Served]:
    config = FrontendConfig(idle_timeout_s=TIMEOUT, body_timeout_s=TIMEOUT, max_connections=CAP)
    with serving(smol_path, config) as s:
        yield s


@pytest.fixture(scope="module")
def capped(smol_path: Path) -> Iterator[Served]:
    with serving(smol_path, FrontendConfig(max_connections=CAP)) as s:  # idle ones stay open
        yield s


def connect(served: Served) -> socket.socket:
    sock = socket.create_connection((served.server.host, served.server.port), timeout=10)
    sock.settimeout(10)
    return sock


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """True if the server closes ``sock`` within ``seconds`` (whatever it sent before)."""
    sock.settimeout(seconds)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def test_an_idle_connection_is_closed(limited: Served) -> None:
    with connect(limited) as fresh, connect(limited) as used:
        used.sendall(b"GET /live HTTP/1.1\r\nHost: x\r\n\r\n")
        assert used.recv(65536).startswith(b"HTTP/1.1 200")
        started = time.monotonic()
        assert closed_within(fresh, 5) and closed_within(used, 5)
        assert time.monotonic() - started < 3


def test_a_slowloris_connection_is_closed(limited: Served) -> None:
    with connect(limited) as sock:
        sock.sendall(b"GET /live HTTP/1.1\r\n")
        started = time.monotonic()
        closed = False
        while not closed and time.monotonic() - started < 5:
            try:
                sock.sendall(b"x")  # a header that never ends, a byte at a time
            except OSError:
                closed = True
                break
            time.sleep(0.05)
            sock.setblocking(False)
            try:
                closed = sock.recv(65536) == b""
            except BlockingIOError:
                pass
            except OSError:
                closed = True
            sock.setblocking(True)
        assert closed and time.monotonic() - started < 3


def test_a_slow_body_gets_a_408(limited: Served) -> None:
    with connect(limited) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"model": '
        )
        started = time.monotonic()
        reply = sock.recv(65536)
        assert reply.startswith(b"HTTP/1.1 408") and b"request_timeout" in reply
        assert time.monotonic() - started < 3


def test_health_answers_while_idle_connections_fill_the_cap(capped: Served) -> None:
    held = [connect(capped) for _ in range(CAP * 2)]
    try:
        time.sleep(0.1)  # let the server accept them all
        with httpx.Client(base_url=capped.url, timeout=5) as http:
            assert http.get("/health").status_code == 200
        # The oldest ones made room for the newer ones: never more than the cap were open.
        assert [closed_within(sock, 0.2) for sock in held] == [True] * (CAP + 1) + [False] * (CAP - 1)
    finally:
        for sock in held:
            sock.close()


def test_a_newcomer_is_refused_with_a_503_when_every_connection_is_busy(capped: Served) -> None:
    limited = capped
    headers = limited.script("slow", FakeScript(token_delay_s=0.05))
    body = b'{"model": "%s", "prompt": "x", "max_tokens": 200}' % MODEL.encode()
    busy = [connect(limited) for _ in range(CAP)]
    try:
        for sock in busy:
            sock.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"x-route-key: %s\r\nContent-Length: %d\r\n\r\n%s"
                % (headers["x-route-key"].encode(), len(body), body)
            )
        deadline = time.monotonic() + 5
        while limited.backend.active < CAP and time.monotonic() < deadline:
            time.sleep(0.01)
        assert limited.backend.active == CAP
        with connect(limited) as newcomer:
            assert newcomer.recv(65536).startswith(b"HTTP/1.1 503")
    finally:
        for sock in busy:
            sock.close()
    deadline = time.monotonic() + 5
    while limited.backend.active and time.monotonic() < deadline:  # the busy ones were aborted
        time.sleep(0.01)
    assert limited.backend.active == 0


def test_many_requests_reuse_connections_under_the_cap(capped: Served) -> None:
    limited = capped
    errors: list[BaseException] = []

    def client() -> None:
        try:
            with httpx.Client(base_url=limited.url, timeout=10) as http:
                for _ in range(5):
                    assert http.get("/live").status_code == 200
        except BaseException as exc:  # noqa: BLE001 - reported by the assert below
            errors.append(exc)

    threads = [threading.Thread(target=client) for _ in range(CAP - 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert errors == []


@needs_openssl
def test_tls(smol_path: Path, tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    config = FrontendConfig(ssl_certfile=str(cert), ssl_keyfile=str(key))
    with serving(smol_path, config) as tls:
        assert tls.url.startswith("https://")
        with httpx.Client(base_url=tls.url, verify=ssl.create_default_context(cafile=str(cert))) as http:
            assert http.get("/live").status_code == 200
        with (
            pytest.raises(httpx.TransportError),
            httpx.Client(base_url=tls.url.replace("https", "http")) as plain,
        ):
            plain.get("/live")
