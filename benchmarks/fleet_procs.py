"""The processes of ``fleet_scale.py``: the frontend (``interlock frontend``), the fleet
processes (``fleet_workers.py``) and the link proxy (``fleet_proxy.py``), each started with
PR_SET_PDEATHSIG so that none outlives the benchmark.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import msgspec
from fleet_measure import cpu_s
from fleet_workers import FleetLaunch

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent


def die_with_parent() -> None:
    import ctypes

    with contextlib.suppress(OSError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def child_env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listen_port() -> int:
    """A free port below the kernel's ephemeral range, so that none of the fleet's thousands of
    sockets (each bound to an ephemeral port) can take it between now and the bind."""
    low = 32768
    with contextlib.suppress(OSError, ValueError):
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(max(1024, low - 12000), low)
        with socket.socket() as s, contextlib.suppress(OSError):
            s.bind(("127.0.0.1", port))
            return port
    return free_port()


def stop(proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


class FrontendProcess:
    """``interlock frontend`` on a free port; keeps the CPU of the ones it stopped."""

    def __init__(
        self,
        nats_url: str,
        logs: Path,
        lease: tuple[float, float],
        tag: str = "frontend",
        extra: tuple[str, ...] = (),
    ) -> None:
        self.nats_url = nats_url
        self.tag = tag
        self.extra = extra
        """More flags for ``interlock frontend``."""
        self.port = listen_port()
        self.logs = logs
        self.lease = lease
        self.proc: subprocess.Popen[bytes] | None = None
        self.spawned = 0.0
        self.retired_cpu = 0.0
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def cpu(self) -> float:
        return self.retired_cpu + (cpu_s(self.proc.pid) if self.proc is not None else 0.0)

    def start(self) -> None:
        self.starts += 1
        log = open(self.logs / f"{self.tag}-{self.starts}.log", "wb")  # noqa: SIM115 - the child owns it
        args = ["--port", str(self.port), "--nats-url", self.nats_url, "--log-level", "WARNING"]
        args += ["--heartbeat-interval", str(self.lease[0]), "--heartbeat-timeout", str(self.lease[1])]
        args += self.extra
        self.spawned = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "interlock.cli.main", "frontend", *args],
            cwd=ROOT,
            env=child_env(),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,
        )
        log.close()

    def stop(self) -> None:
        if self.proc is not None:
            self.retired_cpu += cpu_s(self.proc.pid)
            stop(self.proc)
            self.proc = None


def start_fleet(
    template: FleetLaunch, workers: int, procs: int, logs: Path
) -> tuple[list[subprocess.Popen[bytes]], float]:
    """``procs`` fleet processes sharing ``workers`` workers (``template`` but for ``first`` and
    ``count``); returned once every worker is registered, with the seconds that took."""
    t0 = time.monotonic()
    started: list[subprocess.Popen[bytes]] = []
    per = -(-workers // procs)
    for p in range(procs):
        first, count = p * per, min(per, workers - p * per)
        if count <= 0:
            break
        proc = subprocess.Popen(
            [sys.executable, str(HERE / "fleet_workers.py")],
            cwd=ROOT,
            env=child_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=open(logs / f"fleet-{p}.log", "wb"),  # noqa: SIM115 - the child owns it
            preexec_fn=die_with_parent,
        )
        assert proc.stdin is not None
        proc.stdin.write(msgspec.json.encode(msgspec.structs.replace(template, first=first, count=count)))
        proc.stdin.close()
        started.append(proc)
    for p, proc in enumerate(started):
        assert proc.stdout is not None
        line = proc.stdout.readline().decode().strip()
        if not line.startswith("ready"):
            tail = (logs / f"fleet-{p}.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"fleet process {p} did not start: {line!r}\n{tail}")
    return started, time.monotonic() - t0


def start_proxy(target_port: int, mode: str) -> tuple[subprocess.Popen[bytes], int]:
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "fleet_proxy.py"), str(target_port), mode],
        cwd=ROOT,
        env=child_env(),
        stdout=subprocess.PIPE,
        preexec_fn=die_with_parent,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode().split()
    if len(line) != 2 or line[0] != "listening":
        stop(proc)
        raise RuntimeError(f"the proxy did not start: {line!r}")
    return proc, int(line[1])
