"""Framework overhead: Interlock against Dynamo 1.6.1, model time close to zero.

Both systems serve the same converted SmolLM2 folder (same tokenizer) from two mock workers
that take ~0 model time (``--speedup 1000`` / ``--speedup-ratio 1000``), so what is measured is
the framework: HTTP, templating and tokenization, routing, the request plane, detokenization
and SSE. Per system, one run measures

* requests/s at concurrency 64 (and its p50/p99),
* p50/p99 latency at concurrency 1,

each with keep-alive connections and with a new connection per request, for streaming chat
completions with a short prompt and ``max_tokens=16`` (``ignore_eos``, so exactly 16 tokens,
checked through the usage chunk before the load starts); and the frontend process's RSS when
idle (after the warm-up requests), its peak over its whole life (``VmHWM`` at the end, start-up
included) and its peak while serving (``VmHWM`` reset once idle, through ``clear_refs``).

The load generator is one lean raw-asyncio HTTP/1.1 client on uvloop, identical for every
system; it shares the machine's cores with the servers, so it does as little as possible per
chunk (one buffer append, a suffix check). Every process is started here in its own session
and killed at the end, also on error or Ctrl-C.

With ``--prompt-tokens 8000,32000,60000`` it measures long prompts instead (issue 31): both
systems serve a copy of the model folder with a 131,072-token context, and per length and per
mode (the same prompt again, a sentence appended, a sentence prepended: ``LONG_MODES``) it gives
requests/s, latency and server CPU per request at ``--long-concurrency``; ``--interference``
adds short streams' inter-chunk p99 alone and with long prompts arriving beside them. Server
CPU counts every process the system started (workers run in process groups of their own).

    PYTHONPATH=. .venv/bin/python benchmarks/framework_overhead.py
    PYTHONPATH=. .venv/bin/python benchmarks/framework_overhead.py --systems interlock --rounds 2
    PYTHONPATH=. .venv/bin/python benchmarks/framework_overhead.py --systems interlock,dynamo \
        --prompt-tokens 8000,32000,60000 --interference

Dynamo must be installed in /tmp/dynamo-venv as in /work/shared/anchors/dynamo.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INTERLOCK = str(ROOT / ".venv" / "bin" / "interlock")
DYNAMO_PY = "/tmp/dynamo-venv/bin/python"
PROMPT = "Hello! Tell me a short fact about the sea."
MAX_TOKENS = 16
MIB = 1024 * 1024


# ---------------------------------------------------------------- processes


@dataclass
class System:
    """A running system: its process groups, the frontend's pid and the HTTP port."""

    name: str
    port: int
    frontend_pid: int
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)
    cleanup_dirs: list[str] = field(default_factory=list)
    api_key: str | None = None
    """Sent as ``Authorization: Bearer`` with every request when set."""
    watch: bool = False
    """Keep the dashboard's live stream open during the measured phases (issue 28)."""

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.procs)

    def stop(self) -> None:
        for p in self.procs:
            _signal_group(p, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(max(0.1, deadline - time.monotonic()))
        for p in self.procs:  # whatever is left in each group, also grandchildren
            _signal_group(p, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(5)
        for d in self.cleanup_dirs:
            shutil.rmtree(d, ignore_errors=True)

    def tail(self, n: int = 30) -> str:
        out = []
        for log in self.logs:
            with contextlib.suppress(OSError):
                out.append(f"--- {log}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-n:]))
        return "\n".join(out)


def _signal_group(p: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, sig)  # start_new_session: the group id is the leader's pid


def _spawn(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as f:
        return subprocess.Popen(
            argv,
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def free_port(below: int | None = None) -> int:
    """A free loopback port (``below``: under that number; Dynamo reads its system port as i16)."""
    for _ in range(200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", random.randrange(20000, below) if below else 0))
            except OSError:
                continue
            port = int(s.getsockname()[1])
        if below is None or port < below:
            return port
    raise RuntimeError("no free port")


def start_interlock(
    single_process: bool,
    model: str,
    logdir: Path,
    security: str = "default",
    *,
    tree: str | None = None,
    observed: bool = False,
    frontend_workers: int = 1,
    block_size: int | None = None,
) -> System:
    """``security``: "default" (serve's generated NATS login + cluster secret, no API key),
    "open" (an external nats-server without login, no cluster secret: the planes unauthenticated,
    as before issue 16) or "keys" (default + an API key checked on every request). ``tree``: run
    Interlock from that source tree (a checkout of an earlier commit) instead of this one.
    ``observed``: access logs at INFO (frontend and workers) and the dashboard open (issue 28).
    ``frontend_workers``: frontend processes on the port (issue 31)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INTERLOCK_CLUSTER", "INTERLOCK_NATS"))}
    env |= {"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "INTERLOCK_LOG_LEVEL": "WARNING"}
    argv = [
        INTERLOCK,
        "serve",
        "--runner",
        "mock",
        "--speedup",
        "1000",
        "--workers",
        "2",
        "--model",
        model,
        "--port",
        str(port),
        "--log-level",
        "INFO" if observed else "WARNING",
    ]
    if block_size is not None:
        argv += ["--block-size", str(block_size)]
    name = "interlock" if security == "default" else f"interlock ({security})"
    if tree is not None:
        env["PYTHONPATH"] = tree
        name = "interlock (before)"
    if observed:
        env["INTERLOCK_LOG_LEVEL"] = "INFO"
        name = "interlock (observed)"
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[Path] = []
    if single_process:
        argv.append("--single-process")
        name = "interlock --single-process"
    if frontend_workers > 1:
        argv += ["--frontend-workers", str(frontend_workers)]
        name = f"interlock --frontend-workers {frontend_workers}"
    if security == "open":
        from interlock.runtime.nats_server import find_binary

        nats_port = free_port()
        logs.append(logdir / "nats_open.log")
        procs.append(_spawn([str(find_binary()), "-a", "127.0.0.1", "-p", str(nats_port)], env, logs[-1]))
        for _ in range(100):  # up before serve connects
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", nats_port), timeout=0.5),
            ):
                break
            time.sleep(0.05)
        argv += ["--nats-url", f"nats://127.0.0.1:{nats_port}"]
    api_key = None
    if security == "keys":
        api_key = "sk-" + "k" * 40
        env["INTERLOCK_API_KEYS"] = api_key
    logs.append(logdir / f"{name.replace(' ', '').replace('-', '_').strip('()')}.log")
    p = _spawn(argv, env, logs[-1])
    return System(name, port, p.pid, [p, *procs], logs, api_key=api_key, watch=observed)


def start_dynamo(
    model: str,
    served_name: str,
    logdir: Path,
    router_mode: str,
    *,
    speedup: str = "1000",
    log_level: str = "warn",
    frontend_args: tuple[str, ...] = (),
    block_size: int | None = None,
    name: str = "dynamo 1.6.1",
) -> System:
    """Two Dynamo mockers and a Dynamo frontend (file discovery, TCP request plane)."""
    kv_dir = tempfile.mkdtemp(prefix="dynamo-kv-")
    port = free_port()
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "DYN_DISCOVERY_BACKEND": "file",
        "DYN_FILE_KV": kv_dir,
        "DYN_REQUEST_PLANE": "tcp",
        "DYN_EVENT_PLANE": "zmq",
        "DYN_TCP_RPC_HOST": "127.0.0.1",
        "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
        "DYN_EVENT_PLANE_HOST": "127.0.0.1",
        "DYN_SYSTEM_HOST": "127.0.0.1",
        "DYN_LOG": log_level,
    }
    env.pop("PYTHONPATH", None)
    sys_ = System(name, port, 0, cleanup_dirs=[kv_dir])
    try:
        for i in range(2):
            log = logdir / f"dynamo_mocker{i}.log"
            p = _spawn(
                [
                    DYNAMO_PY,
                    "-m",
                    "dynamo.mocker",
                    "--model-path",
                    model,
                    "--model-name",
                    served_name,
                    "--speedup-ratio",
                    speedup,
                    *(("--block-size", str(block_size)) if block_size is not None else ()),
                ],
                {**env, "DYN_SYSTEM_PORT": str(free_port(below=32768))},
                log,
            )
            sys_.procs.append(p)
            sys_.logs.append(log)
        log = logdir / "dynamo_frontend.log"
        p = _spawn(
            [
                DYNAMO_PY,
                "-m",
                "dynamo.frontend",
                "--http-host",
                "127.0.0.1",
                "--http-port",
                str(port),
                "--router-mode",
                router_mode,
                *frontend_args,
            ],
            env,
            log,
        )
        sys_.procs.append(p)
        sys_.logs.append(log)
        sys_.frontend_pid = p.pid
    except BaseException:
        sys_.stop()
        raise
    return sys_


def group_pids(system: System) -> list[int]:
    """Every live process of the system: its process groups and all their descendants (serve
    starts its workers and nats-server in sessions of their own)."""
    groups = {p.pid for p in system.procs}
    parent: dict[int, int] = {}
    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = _stat_fields(int(entry.name))
                parent[int(entry.name)] = int(fields[1])
                if int(fields[2]) in groups:
                    pids.add(int(entry.name))
    grew = True
    while grew:
        more = {pid for pid, ppid in parent.items() if ppid in pids} - pids
        pids |= more
        grew = bool(more)
    return sorted(pids)


def frontend_pids(system: System, pids: list[int]) -> list[int]:
    """The frontend's process, and the other frontend processes on its port (``--frontend-workers``)."""
    more = []
    for pid in pids:
        with contextlib.suppress(OSError):
            if b"interlock.cluster.frontend_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                more.append(pid)
    return [system.frontend_pid, *more]


def _stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat after the command name: state [0], ppid [1], pgrp [2], utime [11], stime [12]."""
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of ``pids`` so far."""
    ticks = 0
    for pid in pids:
        with contextlib.suppress(OSError, IndexError, ValueError):
            f = _stat_fields(pid)
            ticks += int(f[11]) + int(f[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def rss_mib(*pids: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of ``pids`` together in MiB."""
    fields = {"VmRSS": 0.0, "VmHWM": 0.0}
    for pid in pids:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in fields:
                fields[key] += int(value.split()[0]) / 1024
    return fields["VmRSS"], fields["VmHWM"]


def reset_peak(*pids: int) -> bool:
    """Restart ``VmHWM`` at the current RSS (``clear_refs`` 5); False where it cannot."""
    try:
        for pid in pids:
            Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


# ---------------------------------------------------------------- the load generator


class _Response(asyncio.Protocol):
    """Collects one HTTP/1.1 response at a time; done when its body is complete."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.waiter: asyncio.Future[bytes] | None = None
        self.header_end = -1
        self.length = -1  # content length, or -1 for chunked
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def expect(self) -> asyncio.Future[bytes]:
        self.buf = bytearray()
        self.header_end = -1
        self.waiter = asyncio.get_running_loop().create_future()
        return self.waiter

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        if self.header_end < 0:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            self.header_end = end + 4
            self.length = -1
            for line in bytes(buf[:end]).lower().split(b"\r\n"):
                if line.startswith(b"content-length:"):
                    self.length = int(line[15:])
        if self.length >= 0:
            done = len(buf) - self.header_end >= self.length
        else:
            done = buf.endswith(b"\r\n0\r\n\r\n") or (
                len(buf) - self.header_end == 5 and buf.endswith(b"0\r\n\r\n")
            )
        if done and self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(bytes(buf))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError(f"connection lost: {exc}"))


@dataclass
class PhaseResult:
    latencies: list[float]
    elapsed: float
    errors: int
    chunks: tuple[int, int]
    cpu_ms: tuple[float, float] = (0.0, 0.0)
    """Server CPU milliseconds per request: (frontend process, all server processes)."""

    @property
    def rps(self) -> float:
        return len(self.latencies) / self.elapsed if self.elapsed else 0.0

    def pct(self, q: float) -> float:
        xs = sorted(self.latencies)
        if not xs:
            return float("nan")
        pos = (len(xs) - 1) * q
        lo = int(pos)
        hi = min(lo + 1, len(xs) - 1)
        return (xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)) * 1000


def request_bytes(
    port: int,
    model: str,
    *,
    usage: bool = False,
    api_key: str | None = None,
    prompt: str = PROMPT,
    max_tokens: int = MAX_TOKENS,
) -> bytes:
    body: dict[str, object] = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }
    if usage:
        body["stream_options"] = {"include_usage": True}
    raw = json.dumps(body, separators=(",", ":")).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
        + (f"Authorization: Bearer {api_key}\r\n" if api_key else "")
        + f"Content-Length: {len(raw)}\r\n\r\n"
    )
    return head.encode() + raw


async def _connect(port: int) -> _Response:
    loop = asyncio.get_running_loop()
    _, proto = await loop.create_connection(_Response, "127.0.0.1", port)
    return proto


async def one_request(port: int, payload: bytes) -> bytes:
    conn = await _connect(port)
    try:
        fut = conn.expect()
        assert conn.transport is not None
        conn.transport.write(payload)
        return await asyncio.wait_for(fut, 30)
    finally:
        assert conn.transport is not None
        conn.transport.close()


async def run_phase(
    port: int,
    payload: bytes | Callable[[int], bytes],
    *,
    concurrency: int,
    requests: int,
    max_seconds: float,
    keep_alive: bool,
) -> PhaseResult:
    """``concurrency`` closed-loop users until ``requests`` are done or ``max_seconds`` passed.
    ``payload``: the same request every time, or the ``i``-th request's bytes."""
    latencies: list[float] = []
    errors = 0
    chunks = [1 << 30, 0]
    left = requests
    clock = time.perf_counter
    start = clock()
    stop_at = start + max_seconds

    async def user() -> None:
        nonlocal left, errors
        conn: _Response | None = None
        while left > 0 and clock() < stop_at:
            left -= 1
            t0 = clock()
            try:
                if conn is None or conn.lost.done():
                    conn = await _connect(port)
                fut = conn.expect()
                assert conn.transport is not None
                conn.transport.write(payload if isinstance(payload, bytes) else payload(left))
                body = await asyncio.wait_for(fut, 30)
            except (OSError, ConnectionError, TimeoutError):
                errors += 1
                conn = None
                continue
            t1 = clock()
            if not body.startswith(b"HTTP/1.1 200"):
                errors += 1
            else:
                latencies.append(t1 - t0)
                n = body.count(b"data: ")
                chunks[0] = min(chunks[0], n)
                chunks[1] = max(chunks[1], n)
            if not keep_alive:
                assert conn.transport is not None
                conn.transport.close()
                conn = None
        if conn is not None and conn.transport is not None:
            conn.transport.close()

    await asyncio.gather(*(user() for _ in range(concurrency)))
    return PhaseResult(latencies, clock() - start, errors, (chunks[0], chunks[1]))


# ---------------------------------------------------------------- one system


async def wait_ready(system: System, model: str, timeout_s: float) -> None:
    """Until a streamed request with usage returns exactly MAX_TOKENS completion tokens."""
    deadline = time.monotonic() + timeout_s
    payload = request_bytes(system.port, model, usage=True, api_key=system.api_key)
    last = ""
    while time.monotonic() < deadline:
        if not system.alive():
            raise RuntimeError(f"{system.name} exited during start-up\n{system.tail()}")
        try:
            body = await one_request(system.port, payload)
        except (OSError, ConnectionError, TimeoutError) as exc:
            last = repr(exc)
            await asyncio.sleep(0.5)
            continue
        if body.startswith(b"HTTP/1.1 200"):
            tokens = _usage_tokens(body)
            if tokens != MAX_TOKENS:
                raise RuntimeError(f"{system.name}: {tokens} completion tokens, expected {MAX_TOKENS}")
            return
        last = body[:300].decode(errors="replace")
        await asyncio.sleep(0.5)
    raise RuntimeError(f"{system.name} not ready after {timeout_s:.0f}s: {last}\n{system.tail()}")


def _usage_tokens(body: bytes) -> int | None:
    for line in body.split(b"\n"):
        if line.startswith(b"data: {") and b'"usage"' in line:
            usage = json.loads(line[6:]).get("usage")
            if usage:
                return int(usage["completion_tokens"])
    return None


@dataclass
class Row:
    system: str
    phases: dict[str, PhaseResult]
    rss_idle: float
    rss_peak: float
    rss_serving: float | None = None
    """Peak RSS from the idle measurement on (None: ``VmHWM`` could not be reset)."""


PHASES = (  # name, concurrency, keep-alive
    ("c64 keep-alive", 64, True),
    ("c64 new conn", 64, False),
    ("c1 keep-alive", 1, True),
    ("c1 new conn", 1, False),
)


async def measure(system: System, model: str, a: argparse.Namespace, log: Callable[[str], None]) -> Row:
    await wait_ready(system, model, a.ready_timeout)
    payload = request_bytes(system.port, model, api_key=system.api_key)
    await run_phase(system.port, payload, concurrency=4, requests=40, max_seconds=10, keep_alive=True)
    await asyncio.sleep(1.0)
    pids = group_pids(system)
    fe = frontend_pids(system, pids)
    idle, life_peak = rss_mib(*fe)
    serving_known = reset_peak(*fe)
    await run_phase(system.port, payload, concurrency=64, requests=a.warmup, max_seconds=10, keep_alive=True)
    phases: dict[str, PhaseResult] = {}
    watcher = asyncio.ensure_future(watch_dashboard(system.port)) if system.watch else None
    for name, conc, keep in PHASES:
        n = a.requests if conc > 1 else a.c1_requests
        cpu0 = cpu_seconds(fe), cpu_seconds(pids)
        r = await run_phase(
            system.port, payload, concurrency=conc, requests=n, max_seconds=a.max_seconds, keep_alive=keep
        )
        done = max(1, len(r.latencies))
        r.cpu_ms = (
            (cpu_seconds(fe) - cpu0[0]) * 1000 / done,
            (cpu_seconds(pids) - cpu0[1]) * 1000 / done,
        )
        phases[name] = r
        log(
            f"  {system.name:28s} {name:15s} {r.rps:7.1f} req/s  p50 {r.pct(0.5):7.2f} ms  "
            f"p99 {r.pct(0.99):7.2f} ms  cpu/req fe {r.cpu_ms[0]:.2f} all {r.cpu_ms[1]:.2f} ms  "
            f"n={len(r.latencies)} err={r.errors} chunks={r.chunks}"
        )
    serving = rss_mib(*fe)[1]
    peak = max(life_peak, serving)
    if watcher is not None:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            received = await watcher
            log(f"  dashboard stream: {received} bytes")
    return Row(system.name, phases, idle, peak, serving if serving_known else None)


async def watch_dashboard(port: int) -> int:
    """Read the dashboard's live stream (``/dashboard/events``) as a browser would, until
    cancelled; the bytes received."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"GET /dashboard/events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: text/event-stream\r\n\r\n".encode()
    )
    received = 0
    try:
        while chunk := await reader.read(65536):
            received += len(chunk)
    finally:
        writer.close()
    return received


# ---------------------------------------------------------------- long prompts (issue 31)

LONG_MODES = ("repeated", "grown", "unique")
"""How the long prompt changes between requests: not at all (one prompt sent again: a server
that caches whole prompts serves it from there); a new sentence at the end (a conversation's
or an agent's next turn: the history unchanged); a new sentence at the start (nothing shared)."""
LONG_WORDS = (
    "river stone light market engine paper garden window signal thunder forest silver ocean "
    "music number yellow travel winter orange castle bridge planet mirror candle letter"
).split()


def long_context_model(model_dir: str, into: Path) -> str:
    """A copy of ``model_dir`` (its files linked) with the context raised to 131,072 tokens, for
    the mock engines of both systems."""
    into.mkdir(parents=True, exist_ok=True)
    for f in Path(model_dir).iterdir():
        if f.name != "config.json" and not (into / f.name).exists():
            (into / f.name).symlink_to(f.resolve())
    config = json.loads((Path(model_dir) / "config.json").read_text())
    config["max_position_embeddings"] = 131072
    (into / "config.json").write_text(json.dumps(config, indent=2))
    return str(into)


def long_prompt(model_dir: str, tokens: int) -> str:
    """Words of plain prose whose chat prompt is about ``tokens`` tokens (the template adds ~30)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    rng = random.Random(tokens)
    text = " ".join(rng.choice(LONG_WORDS) + ("." if rng.random() < 0.1 else "") for _ in range(tokens + 100))
    return str(tok.decode(tok.encode(text).ids[: max(1, tokens - 30)]))


@dataclass
class LongRow:
    system: str
    tokens: int
    mode: str
    result: PhaseResult


async def measure_long(
    system: System, model: str, a: argparse.Namespace, prompts: dict[int, str], log: Callable[[str], None]
) -> list[LongRow]:
    """Per prompt length and mode: requests/s and latency at ``--long-concurrency`` with
    keep-alive, and the server's CPU per request."""
    await wait_ready(system, model, a.ready_timeout)
    pids = group_pids(system)
    fe = frontend_pids(system, pids)
    rows = []
    for tokens, prompt in prompts.items():
        for mode in a.long_modes.split(","):

            def payload(i: int, mode: str = mode, prompt: str = prompt) -> bytes:
                text = {"repeated": prompt, "grown": f"{prompt} Turn {i}.", "unique": f"Turn {i}. {prompt}"}[
                    mode
                ]
                return request_bytes(system.port, model, api_key=system.api_key, prompt=text)

            await run_phase(
                system.port, payload(-1), concurrency=1, requests=2, max_seconds=30, keep_alive=True
            )
            cpu0 = cpu_seconds(fe), cpu_seconds(pids)
            r = await run_phase(
                system.port,
                payload,
                concurrency=a.long_concurrency,
                requests=a.long_requests,
                max_seconds=a.max_seconds,
                keep_alive=True,
            )
            done = max(1, len(r.latencies))
            r.cpu_ms = (
                (cpu_seconds(fe) - cpu0[0]) * 1000 / done,
                (cpu_seconds(pids) - cpu0[1]) * 1000 / done,
            )
            rows.append(LongRow(system.name, tokens, mode, r))
            log(
                f"  {system.name:28s} {tokens:6d} tokens {mode:8s} {r.rps:7.1f} req/s  p50 {r.pct(0.5):8.1f} ms  "
                f"cpu/req fe {r.cpu_ms[0]:.2f} all {r.cpu_ms[1]:.2f} ms  n={len(r.latencies)} err={r.errors}"
            )
    return rows


async def stream_gaps(port: int, payload: bytes, *, concurrency: int, seconds: float) -> list[float]:
    """Gaps between the reads of streamed chunks (seconds) seen by ``concurrency`` streaming
    users over ``seconds``: what a stream's inter-token time looks like to a client."""
    gaps: list[float] = []
    stop_at = time.perf_counter() + seconds

    class Timed(_Response):
        last = 0.0

        def data_received(self, data: bytes) -> None:
            now = time.perf_counter()
            if self.header_end >= 0 and self.last:
                gaps.append(now - self.last)
            self.last = now
            super().data_received(data)

    async def user() -> None:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(Timed, "127.0.0.1", port)
        try:
            while time.perf_counter() < stop_at:
                fut = conn.expect()
                conn.last = 0.0
                assert conn.transport is not None
                conn.transport.write(payload)
                await asyncio.wait_for(fut, 60)
        finally:
            assert conn.transport is not None
            conn.transport.close()

    await asyncio.gather(*(user() for _ in range(concurrency)))
    return gaps


async def measure_interference(
    system: System, model: str, a: argparse.Namespace, prompt: str, log: Callable[[str], None]
) -> tuple[float, float]:
    """Inter-chunk p99 (ms) of 4 short streams alone, then with long prompts arriving beside
    them at ``--interference-rate`` a second (each new at its start: all of it to tokenize)."""
    short = request_bytes(system.port, model, api_key=system.api_key, max_tokens=a.interference_tokens)
    alone = await stream_gaps(system.port, short, concurrency=4, seconds=a.interference_seconds)
    sent: list[asyncio.Task[bytes]] = []

    async def arrivals() -> None:
        while True:
            payload = request_bytes(
                system.port, model, api_key=system.api_key, prompt=f"Turn {len(sent)}. {prompt}"
            )
            sent.append(asyncio.ensure_future(one_request(system.port, payload)))
            await asyncio.sleep(1.0 / a.interference_rate)

    task = asyncio.ensure_future(arrivals())
    try:
        beside = await stream_gaps(system.port, short, concurrency=4, seconds=a.interference_seconds)
    finally:
        task.cancel()
        done = await asyncio.gather(*sent, return_exceptions=True)
    failed = sum(1 for r in done if not isinstance(r, bytes) or not r.startswith(b"HTTP/1.1 200"))
    p99 = [PhaseResult(g, 1.0, 0, (0, 0)).pct(0.99) for g in (alone, beside)]
    log(
        f"  {system.name:28s} inter-chunk p99 alone {p99[0]:.2f} ms, beside long prompts {p99[1]:.2f} ms "
        f"({len(alone)} / {len(beside)} gaps, {len(sent)} long prompts, {failed} failed)"
    )
    return p99[0], p99[1]


def long_table(rows: list[LongRow]) -> str:
    lines = [
        "| system | prompt tokens | mode | req/s | p50 / p99 ms | server CPU ms/request (frontend / all) |",
        "|" + "---|" * 6,
    ]
    for r in rows:
        x = r.result
        lines.append(
            f"| {r.system} | {r.tokens:,} | {r.mode} | {x.rps:.1f} | {x.pct(0.5):.0f} / {x.pct(0.99):.0f} "
            f"| {x.cpu_ms[0]:.1f} / {x.cpu_ms[1]:.1f} |"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------- report


def table(rows: list[Row]) -> str:
    head = (
        "| system | req/s c=64 keep-alive | req/s c=64 new conn | p50 / p99 ms c=1 keep-alive "
        "| p50 / p99 ms c=1 new conn | frontend RSS MiB idle / peak serving / peak with start-up "
        "| server CPU ms/request c=64 keep-alive (frontend / all) |"
    )
    lines = [head, "|" + "---|" * 7]
    for r in rows:
        p = r.phases
        lines.append(
            f"| {r.system} | {p['c64 keep-alive'].rps:.0f} | {p['c64 new conn'].rps:.0f} "
            f"| {p['c1 keep-alive'].pct(0.5):.1f} / {p['c1 keep-alive'].pct(0.99):.1f} "
            f"| {p['c1 new conn'].pct(0.5):.1f} / {p['c1 new conn'].pct(0.99):.1f} "
            f"| {r.rss_idle:.0f} / {'-' if r.rss_serving is None else f'{r.rss_serving:.0f}'} / {r.rss_peak:.0f} "
            f"| {p['c64 keep-alive'].cpu_ms[0]:.2f} / {p['c64 keep-alive'].cpu_ms[1]:.2f} |"
        )
    return "\n".join(lines)


def machine() -> str:
    cpu = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3
    return f"{os.cpu_count()} vCPU ({cpu}), {mem:.0f} GiB, Python {platform.python_version()}"


@contextlib.contextmanager
def running(start: Callable[[], System]) -> Iterator[System]:
    system = start()
    try:
        yield system
    finally:
        system.stop()


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--systems",
        default="interlock,interlock-single,dynamo",
        help="comma-separated: interlock, interlock-single, dynamo; and for the cost of "
        "security (issue 16): interlock-open (planes without login or secret), "
        "interlock-keys (with an API key); for the cost of observability (issue 28): "
        "interlock-observed (access logs at INFO, the dashboard open) against interlock-before "
        "(--before-tree); for frontends on every core (issue 31): interlock-fwN (N frontend "
        "processes on one port, --frontend-workers N)",
    )
    p.add_argument("--rounds", type=int, default=1, help="measure every system this many times, interleaved")
    p.add_argument(
        "--block-size",
        type=int,
        default=None,
        help="tokens per KV block on both sides (default: each system's own, Interlock 16, Dynamo's mocker 64)",
    )
    p.add_argument("--requests", type=int, default=3000, help="requests per c=64 phase")
    p.add_argument("--c1-requests", type=int, default=300, help="requests per c=1 phase")
    p.add_argument("--warmup", type=int, default=500, help="c=64 warm-up requests")
    p.add_argument("--max-seconds", type=float, default=20.0, help="cap per phase")
    p.add_argument("--ready-timeout", type=float, default=180.0)
    p.add_argument("--dynamo-router-mode", default="kv", help="Interlock's default policy is kv too")
    p.add_argument("--model", default=None, help="HF folder (default: the converted SmolLM2)")
    p.add_argument("--logdir", default=None, help="server logs (default: a temporary folder)")
    p.add_argument(
        "--before-tree",
        default=None,
        help="interlock-before: a source tree of an earlier commit (git worktree add /tmp/before <commit>)",
    )
    p.add_argument(
        "--prompt-tokens",
        default=None,
        help="long prompts instead (issue 31): comma-separated lengths in tokens, e.g. 8000,32000,60000; "
        "both systems serve a copy of the model with a 131,072-token context",
    )
    p.add_argument("--long-modes", default=",".join(LONG_MODES), help=f"of {LONG_MODES}")
    p.add_argument("--long-concurrency", type=int, default=8)
    p.add_argument("--long-requests", type=int, default=200, help="requests per length and mode")
    p.add_argument(
        "--interference",
        action="store_true",
        help="with --prompt-tokens: short streams' inter-chunk p99 alone and with the longest prompts arriving",
    )
    p.add_argument("--interference-tokens", type=int, default=128, help="tokens per short stream")
    p.add_argument("--interference-seconds", type=float, default=8.0)
    p.add_argument(
        "--interference-rate", type=float, default=2.0, help="long prompts a second beside the streams"
    )
    return p.parse_args()


@dataclass
class Results:
    rows: list[Row] = field(default_factory=list)
    long_rows: list[LongRow] = field(default_factory=list)
    interference: dict[str, tuple[float, float]] = field(default_factory=dict)


async def main_async(a: argparse.Namespace) -> Results:
    from interlock.model_store import resolve_model, served_model_name

    model_dir = a.model or str(resolve_model("smollm2"))
    logdir = Path(a.logdir or tempfile.mkdtemp(prefix="overhead-logs-"))
    logdir.mkdir(parents=True, exist_ok=True)
    lengths = [int(x) for x in a.prompt_tokens.split(",")] if a.prompt_tokens else []
    if lengths:
        model_dir = long_context_model(model_dir, logdir / "smollm2-long")
    prompts = {n: long_prompt(model_dir, n) for n in lengths}
    served = served_model_name(model_dir)
    bs = a.block_size
    starters: dict[str, Callable[[], System]] = {
        "interlock": lambda: start_interlock(False, model_dir, logdir, block_size=bs),
        "interlock-single": lambda: start_interlock(True, model_dir, logdir, block_size=bs),
        "interlock-open": lambda: start_interlock(False, model_dir, logdir, "open", block_size=bs),
        "interlock-keys": lambda: start_interlock(False, model_dir, logdir, "keys", block_size=bs),
        "interlock-before": lambda: start_interlock(
            False, model_dir, logdir, tree=a.before_tree, block_size=bs
        ),
        "interlock-observed": lambda: start_interlock(False, model_dir, logdir, observed=True, block_size=bs),
        "dynamo": lambda: start_dynamo(model_dir, served, logdir, a.dynamo_router_mode, block_size=bs),
    }
    names = [s.strip() for s in a.systems.split(",") if s.strip()]
    for name in names:
        if name.startswith("interlock-fw") and name[len("interlock-fw") :].isdigit():
            n = int(name[len("interlock-fw") :])
            starters[name] = lambda n=n: start_interlock(  # type: ignore[misc]
                False, model_dir, logdir, frontend_workers=n, block_size=bs
            )
    unknown = set(names) - set(starters)
    if unknown:
        raise SystemExit(f"unknown systems: {sorted(unknown)}")
    if "interlock-before" in names and not (a.before_tree and Path(a.before_tree, "interlock").is_dir()):
        raise SystemExit("interlock-before needs --before-tree, a source tree with interlock/ in it")
    if "dynamo" in names and not Path(DYNAMO_PY).exists():
        raise SystemExit(f"{DYNAMO_PY} missing: install Dynamo as in /work/shared/anchors/dynamo.md")
    print(f"model {model_dir} served as {served}; logs in {logdir}", flush=True)
    out = Results()
    for rnd in range(a.rounds):
        for name in names:
            print(f"round {rnd + 1}: {name}", flush=True)
            with running(starters[name]) as system:
                if not lengths:
                    out.rows.append(await measure(system, served, a, lambda s: print(s, flush=True)))
                    continue
                out.long_rows += await measure_long(
                    system, served, a, prompts, lambda s: print(s, flush=True)
                )
                if a.interference:
                    out.interference[f"{system.name} round {rnd + 1}"] = await measure_interference(
                        system, served, a, prompts[max(lengths)], lambda s: print(s, flush=True)
                    )
    return out


def main() -> None:
    a = parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # runs the finally blocks that stop every process

    signal.signal(signal.SIGTERM, interrupted)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    out = asyncio.run(main_async(a))
    print()
    print(f"{started}; {machine()}; load {os.getloadavg()[0]:.1f}")
    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}")
    if out.rows:
        print(table(out.rows))
    if out.long_rows:
        print(long_table(out.long_rows))
    for name, (alone, beside) in out.interference.items():
        print(
            f"{name}: short streams' inter-chunk p99 {alone:.2f} ms alone, {beside:.2f} ms beside long prompts"
        )


if __name__ == "__main__":
    main()
