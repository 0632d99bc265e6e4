"""Connection limits: idle, slow-header and slow-body timeouts and rates, the fair cap on open
connections with its reserve for probes, and the per-client caps. A client is an address: the
tests connect from several loopback addresses (127.0.0.0/8 is all loopback)."""

from __future__ import annotations

import re
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import httpx2
import openai
import pytest

from interlock.frontend import FakeScript, FrontendConfig
from interlock.frontend.app import CONNECTIONS_KEY
from interlock.frontend.auth import AuthConfig
from tests.certs import needs_openssl, self_signed
from tests.frontend.conftest import MODEL, Served, serving

TIMEOUT = 0.5
CAP = 6
CROWD, NORMAL, OTHER = "127.0.0.2", "127.0.0.3", "127.0.0.4"


@pytest.fixture(scope="module")
def limited(smol_path: Path) -> Iterator[Served]:
    config = FrontendConfig(idle_timeout_s=TIMEOUT, body_timeout_s=TIMEOUT, max_connections=CAP)
    with serving(smol_path, config) as s:
        yield s


@pytest.fixture(scope="module")
def capped(smol_path: Path) -> Iterator[Served]:
    with serving(smol_path, FrontendConfig(max_connections=CAP)) as s:  # idle ones stay open
        yield s


def connect(served: Served, source: str | None = None) -> socket.socket:
    """A connection to ``served``, from the loopback address ``source`` if given: 127.0.0.0/8 is
    all loopback, so each address is a client of its own to the server."""
    address = (source, 0) if source else None
    sock = socket.create_connection(
        (served.server.host, served.server.port), timeout=10, source_address=address
    )
    sock.settimeout(10)
    return sock


def post_head(length: int, route_key: str = "none") -> bytes:
    return (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"x-route-key: %s\r\nContent-Length: %d\r\n\r\n" % (route_key.encode(), length)
    )


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


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


def test_when_every_connection_is_serving_probes_answer_from_the_reserve(capped: Served) -> None:
    limited = capped
    headers = limited.script("slow", FakeScript(token_delay_s=0.05))
    body = b'{"model": "%s", "prompt": "x", "max_tokens": 200}' % MODEL.encode()
    busy = [connect(limited, CROWD) for _ in range(CAP)]
    try:
        for sock in busy:
            sock.sendall(post_head(len(body), headers["x-route-key"]) + body)
        assert wait_until(lambda: limited.backend.active == CAP)
        with connect(limited, NORMAL) as probe:
            probe.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert probe.recv(65536).startswith(b"HTTP/1.1 200")
        with connect(limited, NORMAL) as newcomer:  # a reserve slot serves probes only
            newcomer.sendall(post_head(len(body), headers["x-route-key"]) + body)
            reply = newcomer.recv(65536)
            assert reply.startswith(b"HTTP/1.1 503") and b"too_many_connections" in reply
    finally:
        for sock in busy:
            sock.close()
    assert wait_until(lambda: limited.backend.active == 0)  # the busy ones were aborted


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


SLOW_BODIES = 4000
FAIR_CAP = 10


@pytest.fixture(scope="module")
def fair(smol_path: Path) -> Iterator[Served]:
    # The defaults (no API key, no per-client cap in reach) but for a small cap and a short grace.
    with serving(smol_path, FrontendConfig(max_connections=FAIR_CAP, body_grace_s=0.5)) as s:
        yield s


def test_4000_slow_bodies_while_a_normal_client_and_health_are_still_served(fair: Served) -> None:
    """The report: slow bodies from one process against a small --max-connections reset every
    new connection, /health included, for up to the body timeout."""
    tracker = fair.server.runner.app[CONNECTIONS_KEY]
    normal = openai.OpenAI(
        base_url=fair.url + "/v1",
        api_key="unused",
        max_retries=0,
        timeout=10,
        http_client=httpx2.Client(transport=httpx2.HTTPTransport(local_address=NORMAL)),  # openai's httpx
    )
    probe = httpx.Client(base_url=fair.url, transport=httpx.HTTPTransport(local_address=OTHER), timeout=10)
    crowd: list[socket.socket] = []
    finished: list[str] = []
    most_open = 0
    try:
        for i in range(SLOW_BODIES):
            try:
                sock = connect(fair, CROWD)
                crowd.append(sock)
                sock.sendall(post_head(100_000) + b'{"model": ')  # and not another byte
            except OSError:
                pass  # refused or reset already: the crowd just opens the next one
            most_open = max(most_open, tracker.open_connections)
            if i % 400 == 399:
                r = normal.completions.create(model=MODEL, prompt="Say hi", max_tokens=4)
                finished.append(r.choices[0].finish_reason)
                assert probe.get("/health").status_code == 200
    finally:
        for sock in crowd:
            sock.close()
        probe.close()
        normal.close()
    assert finished == ["length"] * (SLOW_BODIES // 400)
    assert most_open <= FAIR_CAP + FrontendConfig().reserved_connections
    shed = probe_metrics(fair)
    assert shed.get("reserve_only", 0) > 0  # the crowd's extra connections got probes-only slots


def probe_metrics(served: Served) -> dict[str, float]:
    with httpx.Client(base_url=served.url, transport=httpx.HTTPTransport(local_address=OTHER)) as http:
        text = http.get("/metrics").text
    return {
        m[0]: float(m[1])
        for m in re.findall(r'^interlock_http_shed_total\{reason="(\w+)"\} (\S+)', text, re.M)
    }


def test_a_body_slower_than_the_minimum_rate_gets_a_408_before_the_body_timeout(smol_path: Path) -> None:
    config = FrontendConfig(min_body_rate=1000, body_grace_s=0.3, body_timeout_s=60)
    with serving(smol_path, config) as slow, connect(slow) as sock:
        sock.sendall(post_head(10_000))
        reply = b""
        while not reply:  # a byte every 50 ms: 20 bytes/s, under the 1000 required
            sock.sendall(b" ")
            time.sleep(0.05)
            sock.setblocking(False)
            try:
                reply = sock.recv(65536)
            except BlockingIOError:
                pass
            sock.setblocking(True)
        assert reply.startswith(b"HTTP/1.1 408") and b"min_body_rate" in reply
        assert b"Connection: close" in reply  # no keep-alive after a body left unread


def test_one_address_holds_at_most_max_client_connections(smol_path: Path) -> None:
    with serving(smol_path, FrontendConfig(max_client_connections=3)) as s:
        uploading = [connect(s, CROWD) for _ in range(3)]
        try:
            for sock in uploading:
                sock.sendall(post_head(1000) + b"{")
            tracker = s.server.runner.app[CONNECTIONS_KEY]
            assert wait_until(lambda: tracker.open_connections == 3)
            with connect(s, CROWD) as fourth:  # no idle one of its own to make room: refused
                reply = fourth.recv(65536)
                assert reply.startswith(b"HTTP/1.1 503") and b"too_many_connections" in reply
            with connect(s, NORMAL) as other:
                other.sendall(b"GET /live HTTP/1.1\r\nHost: x\r\n\r\n")
                assert other.recv(65536).startswith(b"HTTP/1.1 200")
        finally:
            for sock in uploading:
                sock.close()


def test_requests_in_flight_are_capped_per_address_and_per_api_key(smol_path: Path) -> None:
    config = FrontendConfig(max_client_requests=2, auth=AuthConfig(api_keys=("k1", "k2")))
    with serving(smol_path, config) as s:
        headers = s.script("held", FakeScript(token_delay_s=0.05))
        body = b'{"model": "%s", "prompt": "x", "max_tokens": 1000, "stream": true}' % MODEL.encode()

        def start(source: str, key: str) -> socket.socket:
            sock = connect(s, source)
            head = post_head(len(body), headers["x-route-key"])
            sock.sendall(head[:-2] + b"Authorization: Bearer %s\r\n\r\n" % key.encode() + body)
            return sock

        def refusal(source: str, key: str) -> bytes:
            with start(source, key) as sock:
                return sock.recv(65536)

        held = [start(CROWD, "k1"), start(CROWD, "k2")]
        try:
            assert wait_until(lambda: s.backend.active == 2)
            reply = refusal(CROWD, "k2")  # the address is at its cap, whatever the key
            assert reply.startswith(b"HTTP/1.1 429") and b"max_client_requests" in reply
            held.append(start(NORMAL, "k1"))
            assert wait_until(lambda: s.backend.active == 3)
            reply = refusal(OTHER, "k1")  # k1 is at its cap from two addresses
            assert reply.startswith(b"HTTP/1.1 429") and b"max_client_requests" in reply
            assert s.backend.active == 3
        finally:
            for sock in held:
                sock.close()
        assert wait_until(lambda: s.backend.active == 0)
        with httpx.Client(base_url=s.url, timeout=10) as http:  # every count was released
            r = http.post(
                "/v1/completions",
                json={"model": MODEL, "prompt": "x", "max_tokens": 2},
                headers={"Authorization": "Bearer k1"},
            )
            assert r.status_code == 200


def test_requests_in_flight_are_capped_per_end_user(smol_path: Path) -> None:
    with serving(smol_path, FrontendConfig(max_client_requests=1)) as s:
        headers = s.script("held-user", FakeScript(token_delay_s=0.05))

        def start(source: str, user: str) -> socket.socket:
            body = (
                b'{"model": "%s", "prompt": "x", "max_tokens": 1000, "stream": true, "safety_identifier": "%s"}'
                % (
                    MODEL.encode(),
                    user.encode(),
                )
            )
            sock = connect(s, source)
            sock.sendall(post_head(len(body), headers["x-route-key"]) + body)
            return sock

        held = [start(CROWD, "ann")]
        try:
            assert wait_until(lambda: s.backend.active == 1)
            with start(NORMAL, "ann") as sock:  # another address, the same end user
                reply = sock.recv(65536)
            assert reply.startswith(b"HTTP/1.1 429") and b"end user" in reply
            held.append(start(NORMAL, "bob"))  # another end user from that address is served
            assert wait_until(lambda: s.backend.active == 2)
        finally:
            for sock in held:
                sock.close()
        assert wait_until(lambda: s.backend.active == 0)
