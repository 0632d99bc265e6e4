"""Bad input costs nothing else: size, nesting and header limits, over HTTP; and the memory of
every input stays bounded (prompts, streams nobody reads, kept headers), measured on a frontend
in a process of its own."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import random
import re
import socket
import string
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from interlock.frontend import FakeScript, FrontendConfig
from interlock.frontend.limits import check_depth
from tests.frontend.conftest import MODEL, Served, serving

USER = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def strict(smol_path: Path) -> Iterator[Served]:
    config = FrontendConfig(max_prompt_chars=300, max_prompt_tokens=20, max_json_depth=8)
    with serving(smol_path, config) as s:
        yield s


@pytest.fixture(scope="module")
def http(served: Served) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served.url, timeout=20) as client:
        yield client


def error_of(r: httpx.Response, status: int) -> dict[str, object]:
    assert r.status_code == status, r.text
    return r.json()["error"]  # type: ignore[no-any-return]


def vm_bytes(pid: int, field: str) -> int:
    """A figure of /proc/PID/status in bytes: VmRSS (resident now), VmHWM (peak resident)."""
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(rf"^{field}:\s+(\d+) kB", status, re.M)
    assert match is not None
    return int(match.group(1)) * 1024


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (the machine's load does not inflate it)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class OwnFrontend:
    """``python -m interlock.frontend`` (a FakeBackend) in a process of its own, so its resident
    memory is the frontend's alone."""

    pid: int
    url: str
    log: list[str]

    def reset_peak(self) -> int:
        """Start a new peak (VmHWM) from the current resident size; returns that size."""
        Path(f"/proc/{self.pid}/clear_refs").write_text("5")
        return vm_bytes(self.pid, "VmRSS")

    def peak(self) -> int:
        return vm_bytes(self.pid, "VmHWM")

    def shed(self, reason: str) -> float:
        text = httpx.get(self.url + "/metrics", timeout=10).text
        found = re.search(rf'^interlock_http_shed_total\{{reason="{reason}"\}} (\S+)', text, re.M)
        return float(found.group(1)) if found else 0.0


@contextlib.contextmanager
def own_frontend(smol_path: Path, *flags: str) -> Iterator[OwnFrontend]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "interlock.frontend", "--model-path", str(smol_path), "--port", "0", *flags],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        url = None
        deadline = time.monotonic() + 60
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            assert line, "the frontend exited before listening"
            found = re.search(r"listening on (http://\S+)", line)
            url = found.group(1) if found else None
        assert url is not None
        log: list[str] = []
        threading.Thread(target=lambda: log.extend(proc.stderr or ()), daemon=True).start()  # never blocks it
        with httpx.Client(base_url=url, timeout=60) as client:
            warm = client.post("/v1/completions", json={"model": "fake", "prompt": "hi", "max_tokens": 1})
            assert warm.status_code == 200  # the tokenizer is loaded: what follows is the requests' cost
        yield OwnFrontend(proc.pid, url, log)
    finally:
        proc.terminate()
        proc.wait(10)


OWN_CONTEXT = 100_000
OWN_MAX_PROMPT_TOKENS = 4096
OWN_STREAM_BUFFER = 64 * 1024


@pytest.fixture(scope="module")
def own(smol_path: Path) -> Iterator[OwnFrontend]:
    flags = (
        *("--context-length", str(OWN_CONTEXT), "--max-prompt-tokens", str(OWN_MAX_PROMPT_TOKENS)),
        *("--max-stream-buffer", str(OWN_STREAM_BUFFER), "--stream-stall-timeout", "1"),
    )
    with own_frontend(smol_path, *flags) as frontend:
        yield frontend


def test_a_30_mb_prompt_is_refused_in_under_a_second_without_growing_the_frontend(own: OwnFrontend) -> None:
    with httpx.Client(base_url=own.url, timeout=60) as client:
        body = json.dumps({"model": "fake", "prompt": "a" * (30 * 1024 * 1024)}).encode()
        before = own.reset_peak()
        cpu_before = cpu_seconds(own.pid)
        r = client.post("/v1/completions", content=body, headers={"content-type": "application/json"})
        cpu = cpu_seconds(own.pid) - cpu_before
        grown = own.peak() - before
    error = error_of(r, 400)
    assert error["param"] == "prompt" and "max_prompt_chars" in str(error["message"])
    assert cpu < 1.0  # CPU time, not wall-clock: the frontend's own cost (it was 35-48 s)
    assert grown < 100 * 1024 * 1024


def words(n_chars: int) -> str:
    """Text of random short words: about 0.56 SmolLM2 tokens a character."""
    rng = random.Random(0)
    vocab = [
        "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(1, 10))) for _ in range(5000)
    ]
    return " ".join(rng.choice(vocab) for _ in range(n_chars // 3))[:n_chars]


def test_prompts_just_under_max_prompt_chars_are_refused_without_encoding_them_whole(
    own: OwnFrontend,
) -> None:
    """The report: 24 such prompts took the frontend from 203 to 973 MB (775 MB kept). Here 8 at
    once, each ~556,000 tokens against a limit of 4,096. Encoded whole, as before: 1,111 MiB peak,
    811 MiB kept; screened: under 40 MiB, mostly the bodies themselves."""
    body = json.dumps({"model": "fake", "prompt": words(999_000)}).encode()  # max_prompt_chars: 1,000,000
    with httpx.Client(base_url=own.url, timeout=60) as client:
        before = own.reset_peak()
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            replies = list(
                pool.map(
                    lambda _: client.post(
                        "/v1/completions", content=body, headers={"content-type": "application/json"}
                    ),
                    range(8),
                )
            )
        grown = own.peak() - before
    for r in replies:
        error = error_of(r, 400)
        assert error["param"] == "prompt"
        assert re.search(
            rf"at least \d+ tokens; .* at most {OWN_MAX_PROMPT_TOKENS} \(max_prompt_tokens\)",
            str(error["message"]),
        )
    assert grown < 64 * 1024 * 1024


def test_clients_that_never_read_their_streams_cost_a_bounded_buffer(own: OwnFrontend) -> None:
    """The report: ~230 bytes a token with no back-pressure. Here 4 streams of 60,000 tokens whose
    clients read nothing: unbounded, the frontend held 192 MiB; bounded, each holds at most
    ``--max-stream-buffer`` (64 KiB) until ``--stream-stall-timeout`` aborts it."""
    body = json.dumps({"model": "fake", "prompt": "x", "max_tokens": 60_000, "stream": True}).encode()
    host, port = own.url.removeprefix("http://").split(":")
    stalled = own.shed("stream_stalled")
    before = own.reset_peak()
    readers = []
    try:
        for _ in range(4):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the kernel holds little for it
            sock.connect((host, int(port)))
            sock.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            readers.append(sock)
        deadline = time.monotonic() + 30
        while own.shed("stream_stalled") < stalled + 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        grown = own.peak() - before
        assert own.shed("stream_stalled") == stalled + 4  # each aborted, its worker request with it
        for sock in readers:  # closed without the rest: what the kernel held, then the end
            assert b"[DONE]" not in read_to_end(sock)
    finally:
        for sock in readers:
            sock.close()
    assert grown < 32 * 1024 * 1024
    assert any("stream_stall_timeout_s" in line for line in own.log)  # the reason, in the log


def read_to_end(sock: socket.socket) -> bytes:
    sock.settimeout(10)
    data = []
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(1 << 20):
            data.append(chunk)
    return b"".join(data)


@pytest.mark.parametrize(
    "header", ["x-session-id", "x-request-id", "x-route-key", "x-worker-id", "x-priority"]
)
def test_a_kept_header_over_max_header_chars_is_a_400_naming_it(http: httpx.Client, header: str) -> None:
    r = http.post("/v1/completions", json={"model": MODEL, "prompt": "x"}, headers={header: "1" * 257})
    error = error_of(r, 400)
    assert error["param"] == header and "max_header_chars" in str(error["message"])


def test_long_session_ids_never_reach_the_session_table(http: httpx.Client, served: Served) -> None:
    """The report: 8 KiB session ids, ~780 MB at the router's table cap (100,000). What reaches
    the backend (the router keeps each session id it sees) is measured here directly."""
    body = {"model": MODEL, "prompt": "x", "max_tokens": 1}
    before = len(served.backend.contexts)
    for i in range(100):
        r = http.post("/v1/completions", json=body, headers={"x-session-id": f"{i:08d}" + "s" * 8000})
        assert error_of(r, 400)["param"] == "x-session-id"
    assert len(served.backend.contexts) == before  # refused before anything was kept
    for i in range(100):
        r = http.post("/v1/completions", json=body, headers={"x-session-id": f"{i:08d}" + "s" * 248})
        assert r.status_code == 200
    kept = sum(len(ctx.session_id or "") for ctx in served.backend.contexts[before:])
    assert kept <= 100 * 256  # at most max_header_chars a session: 25.6 MB at the table's cap


def test_prompt_limits_in_characters_then_tokens(strict: Served) -> None:
    with httpx.Client(base_url=strict.url, timeout=20) as http:
        long_chat = {"model": MODEL, "messages": [{"role": "user", "content": "x" * 301}]}
        error = error_of(http.post("/v1/chat/completions", json=long_chat), 400)
        assert error["param"] == "messages" and "max_prompt_chars" in str(error["message"])
        # Within the limit as sent, over it once the chat template wrapped it.
        near = {"model": MODEL, "messages": [{"role": "user", "content": "x" * 290}]}
        assert "max_prompt_chars" in str(
            error_of(http.post("/v1/chat/completions", json=near), 400)["message"]
        )
        for prompt in ("word " * 30, list(range(100, 130))):
            r = http.post("/v1/completions", json={"model": MODEL, "prompt": prompt})
            error = error_of(r, 400)
            assert error["param"] == "prompt" and "max_prompt_tokens" in str(error["message"])
        assert http.post("/v1/completions", json={"model": MODEL, "prompt": "word " * 5}).status_code == 200
    assert strict.backend.requests and all(len(r.token_ids) <= 20 for r in strict.backend.requests)


@pytest.mark.parametrize("field", ["tools", "tool_choice", "response_format", "unknown_field", "messages"])
def test_deeply_nested_json_is_a_400(http: httpx.Client, field: str) -> None:
    for depth in (1000, 100_000):
        nested = "[" * depth + "]" * depth
        raw = f'{{"model": "{MODEL}", "messages": {json.dumps(USER)}, "{field}": {nested}}}'
        r = http.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
        assert error_of(r, 400)["type"] == "invalid_request_error"
    raw = f'{{"model": "{MODEL}", "prompt": {"[" * 1000 + "]" * 1000}}}'
    r = http.post("/v1/completions", content=raw, headers={"content-type": "application/json"})
    assert "max_json_depth" in str(error_of(r, 400)["message"])


def test_configured_depth_limit(strict: Served) -> None:
    with httpx.Client(base_url=strict.url, timeout=20) as http:
        r = http.post("/v1/completions", json={"model": MODEL, "prompt": [[[[[[[[[1]]]]]]]]]})
        assert "max_json_depth" in str(error_of(r, 400)["message"])


@pytest.mark.parametrize("value", [str(2**64), str(-(2**63)), "high", "1.5", "1e3", "0x10"])
def test_bad_priority_header_is_a_400(http: httpx.Client, value: str) -> None:
    r = http.post(
        "/v1/chat/completions", json={"model": MODEL, "messages": USER}, headers={"x-priority": value}
    )
    assert error_of(r, 400)["param"] == "x-priority"


def test_bad_priority_field_is_a_400(http: httpx.Client) -> None:
    r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": USER, "priority": 2**64})
    assert error_of(r, 400)["param"] == "priority"


def test_clients_sharing_a_request_id_never_collide(http: httpx.Client, served: Served) -> None:
    headers = {**served.script("same-id", FakeScript(token_delay_s=0.01)), "x-request-id": "same"}
    body = {"model": MODEL, "messages": USER, "max_tokens": 5}
    before = len(served.backend.requests)
    with concurrent.futures.ThreadPoolExecutor(20) as pool:
        replies = list(
            pool.map(lambda _: http.post("/v1/chat/completions", json=body, headers=headers), range(20))
        )
    assert [r.status_code for r in replies] == [200] * 20
    assert all(r.headers["x-request-id"] == "same" for r in replies)  # echoed as sent
    ids = [r.request_id for r in served.backend.requests[before:]]
    assert len(ids) == 20 and len(set(ids)) == 20  # the server's own ids, one per request
    assert {r.json()["id"] for r in replies} == set(ids)


def test_check_depth_counts_arrays_objects_and_structs() -> None:
    check_depth([{"a": [1]}], 3, param="p")
    with pytest.raises(Exception, match="max_json_depth"):
        check_depth([{"a": [[1]]}], 3, param="p")
    check_depth("flat", 0, param="p")
