"""``interlock serve`` as a subprocess, with the real model, talked to over loopback HTTP."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
READY = "Interlock serving"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Served:
    process: subprocess.Popen[str]
    port: int
    lines: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def worker_pids(self) -> list[int]:
        """Direct children of serve that are workers (not nats-server)."""
        pids = []
        for task in Path(f"/proc/{self.process.pid}/task").iterdir():
            for pid in (task / "children").read_text().split():
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                if b"worker" in cmd:
                    pids.append(int(pid))
        return sorted(pids)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def start_serve(*args: str, timeout_s: float = 300.0, env: Mapping[str, str] | None = None) -> Served:
    """``interlock serve`` with ``args``, ready; ``env`` adds to (or overrides) the environment."""
    port = free_port()
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "HF_HUB_OFFLINE": "1",
        "INTERLOCK_LOG_LEVEL": "WARNING",
        **(env or {}),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "interlock.cli.main", "serve", "--port", str(port), *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    served = Served(proc, port)
    ready = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            served.lines.append(line)
            if READY in line:
                ready.set()

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while not ready.wait(0.2):
        if proc.poll() is not None or time.monotonic() > deadline:
            served.stop()
            pytest.fail("interlock serve did not become ready:\n" + "".join(served.lines[-60:]))
    return served


FAST_LEASES = ("--heartbeat-interval", "0.25", "--heartbeat-timeout", "2.0")


def wait_until(cond: Callable[[], bool], timeout_s: float) -> bool:
    """Poll ``cond`` every 0.1 s for up to ``timeout_s``; its last value."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


def children(served: Served, marker: bytes) -> list[int]:
    """Live (not zombie) children of serve whose command line contains ``marker``."""
    found = []
    for task in Path(f"/proc/{served.process.pid}/task").iterdir():
        for pid in (task / "children").read_text().split():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if marker in cmd and state != "Z":
                found.append(int(pid))
    return sorted(found)


@pytest.fixture(scope="module")
def two_models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """Two workers of SmolLM2 plus one more under a second name: two models side by side."""
    cfg = tmp_path_factory.mktemp("deploy") / "cluster.yaml"
    cfg.write_text(
        """
control-plane: {heartbeat_interval: 0.25, heartbeat_timeout: 2.0}
execution-groups:
  - model: smollm2
    max_model_len: 1024
    nodes: [{node_role: both, count: 2, max_num_seqs: 16, num_blocks: 256}]
  - model: smollm2
    served_model_name: smollm2-b
    max_model_len: 1024
    nodes: [{node_role: both, count: 1, max_num_seqs: 16, num_blocks: 256}]
routing: {policy: kv}
"""
    )
    served = start_serve("-f", str(cfg))
    yield served
    served.stop()
