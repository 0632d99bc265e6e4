"""Bad input costs nothing else: size, nesting and header limits, over HTTP."""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
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


def vm_peak_bytes(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^VmHWM:\s+(\d+) kB", status, re.M)
    assert match is not None
    return int(match.group(1)) * 1024


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (the machine's load does not inflate it)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_30_mb_prompt_is_refused_in_under_a_second_without_growing_the_frontend(smol_path: Path) -> None:
    # A separate process, so its peak resident memory is the frontend's alone.
    proc = subprocess.Popen(
        [sys.executable, "-m", "interlock.frontend", "--model-path", str(smol_path), "--port", "0"],
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
        with httpx.Client(base_url=url, timeout=60) as client:
            warm = client.post("/v1/completions", json={"model": "fake", "prompt": "hi", "max_tokens": 1})
            assert warm.status_code == 200  # the tokenizer is loaded: what follows is the request's cost
            body = json.dumps({"model": "fake", "prompt": "a" * (30 * 1024 * 1024)}).encode()
            before = vm_peak_bytes(proc.pid)
            cpu_before = cpu_seconds(proc.pid)
            r = client.post("/v1/completions", content=body, headers={"content-type": "application/json"})
            cpu = cpu_seconds(proc.pid) - cpu_before
            grown = vm_peak_bytes(proc.pid) - before
        error = error_of(r, 400)
        assert error["param"] == "prompt" and "max_prompt_chars" in str(error["message"])
        assert cpu < 1.0  # CPU time, not wall-clock: the frontend's own cost (it was 35-48 s)
        assert grown < 100 * 1024 * 1024
    finally:
        proc.terminate()
        proc.wait(10)


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
