"""HTTP servers for the frontend, chosen by measurement (issue 31, item 1).

Every candidate serves the same endpoint in a process of its own on a loopback port:
``POST /v1/chat/completions`` reads a ~300-byte JSON body (parsed) and streams
``text/event-stream``: 17 ``data: {...}`` chunks of ~150 bytes and ``data: [DONE]``, one write
each, no sleeps (``--chunk-delay-ms``: that pause between data chunks, as between tokens), in
whatever framing the server uses natively (chunked for all of these).

* ``aiohttp``: a plain ``web.Application`` on uvloop, ``web.AppRunner(access_log=None,
  handler_cancellation=True, tcp_keepalive=False)`` and ``loop.create_server(runner.server)``,
  the shape of ``serve_frontend`` without its middlewares;
* ``aiohttp-interlock``: the real frontend (``serve_frontend``: middlewares, connection tracker,
  templates, tokenizer, detokenizer) over the in-package ``FakeBackend`` with SmolLM2's
  tokenizer: ``max_tokens=17``, so the same 18 chunks, with the frontend's own work on top;
* ``uvicorn``: a bare ASGI app under uvicorn (uvloop, httptools);
* ``granian-asgi`` / ``granian-rsgi``: the same ASGI app, and an RSGI one, under granian
  (1 worker, uvloop, HTTP/1 only);
* ``raw-uvloop``: an ``asyncio.Protocol`` over httptools' parser writing the response from
  ``data_received`` (no task, no framework): the floor for a Python server.

``NAME:VARIANT`` measures one change to a server (``VARIANTS``), e.g. ``aiohttp:no-nodelay``;
``NAME@PYTHON`` runs it with another interpreter (one with aiohttp and uvloop installed).

Per server and phase (concurrency 64 and 1, keep-alive and a new connection per request, after
a warm-up) a load client in a process of its own (``--client``, the closed-loop raw-socket
client of ``framework_overhead.run_phase`` on uvloop) gives requests/s and p50/p99, and the
server's CPU per request, user and system apart, read from ``/proc/PID/stat`` of the server's
whole process group and every descendant (granian's workers) just before and after the phase;
RSS at the end. Servers run interleaved, a fresh process per server and round.

``--profile`` instead records the server during the two c=64 phases with ``perf record``
(kernel and native symbols, DWARF call chains) and prints, per native entry point (accept,
``connection_made``, ``connection_lost``, ``close``, ...) and per symbol, the CPU per request in
each mode and the difference: what one new connection costs, and where it goes.

    .venv/bin/python benchmarks/http_servers.py --rounds 2
    .venv/bin/python benchmarks/http_servers.py --servers aiohttp,aiohttp:no-nodelay --rounds 2
    .venv/bin/python benchmarks/http_servers.py --servers aiohttp --profile --requests 20000
    .venv/bin/python benchmarks/http_servers.py --chunk-delay-ms 5 --phases "c64 keep-alive,c64 new conn"
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import platform
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from framework_overhead import (
    System,
    _spawn,
    free_port,
    group_pids,
    one_request,
    request_bytes,
    rss_mib,
    run_phase,
)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PYTHON = str(ROOT / ".venv" / "bin" / "python")
GRANIAN = str(ROOT / ".venv" / "bin" / "granian")
PATH = "/v1/chat/completions"
MODEL = "bench"
PROMPT = (
    "Hello! Tell me a short fact about the sea, and then one about the mountains. " * 2
    + "Thanks, and keep each one brief please!"
)
HEADERS = ((b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"))


def _sse_chunk(i: int) -> bytes:
    return (
        b'data: {"id":"chatcmpl-5f0c8a3e9b","object":"chat.completion.chunk",'
        b'"model":"bench","choices":[{"index":0,"delta":{"content":" w%02d"},"finish_reason":null}]}\n\n' % i
    )


CHUNKS = (*(_sse_chunk(i) for i in range(17)), b"data: [DONE]\n\n")
CHUNK_DELAY_S = float(os.environ.get("HTTP_SERVERS_CHUNK_DELAY_MS", "0")) / 1000
"""The pause between data chunks, as between tokens (``--chunk-delay-ms``; passed in the
environment so that granian's workers see it too)."""


async def _pace(i: int) -> None:
    if CHUNK_DELAY_S and 0 < i < len(CHUNKS) - 1:
        await asyncio.sleep(CHUNK_DELAY_S)


SERVERS = ("aiohttp", "aiohttp-interlock", "uvicorn", "granian-asgi", "granian-rsgi", "raw-uvloop")
VARIANTS = {
    "no-nodelay": "skip aiohttp's per-connection tcp_nodelay() (uvloop sets TCP_NODELAY on accept)",
    "no-cancel": "handler_cancellation=False (plain aiohttp only)",
    "gc-freeze": "gc.freeze() after start-up: the collector never rescans start-up objects",
    "no-tracker": "aiohttp-interlock without the connection tracker's protocol wrapper",
    "lean": "no-nodelay + gc-freeze (+ no-tracker for aiohttp-interlock)",
}
PERF_PERIOD_NS = 1_000_000
PHASES = (  # name, concurrency, keep-alive
    ("c64 keep-alive", 64, True),
    ("c64 new conn", 64, False),
    ("c1 keep-alive", 1, True),
    ("c1 new conn", 1, False),
)


# ---------------------------------------------------------------- the servers


async def asgi_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["path"] != PATH or scope["method"] != "POST":
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    json.loads(body)
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    for i, chunk in enumerate(CHUNKS):
        await _pace(i)
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def rsgi_app(scope: Any, proto: Any) -> None:
    if scope.proto != "http":
        return
    if scope.path != PATH or scope.method != "POST":
        proto.response_empty(404, [])
        return
    json.loads(await proto())
    transport = proto.response_stream(200, [(k.decode(), v.decode()) for k, v in HEADERS])
    for i, chunk in enumerate(CHUNKS):
        await _pace(i)
        await transport.send_bytes(chunk)


class RawHTTP(asyncio.Protocol):
    """HTTP/1.1 over httptools with the least a server must do: parse, keep-alive, chunked."""

    HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    HEAD += b"Transfer-Encoding: chunked\r\n\r\n"
    FRAMED = tuple(b"%x\r\n%s\r\n" % (len(c), c) for c in CHUNKS)
    NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"

    def __init__(self) -> None:
        import httptools

        self.parser = httptools.HttpRequestParser(self)
        self.error = httptools.HttpParserError
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except self.error:
            assert self.transport is not None
            self.transport.write(
                b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            )
            self.transport.close()

    def on_url(self, url: bytes) -> None:
        self.url = url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        assert self.transport is not None
        body, self.body = b"".join(self.body), []
        write = self.transport.write
        if self.url != PATH.encode() or self.parser.get_method() != b"POST":
            write(self.NOT_FOUND)
            self._end(b"")
            return
        json.loads(body)
        write(self.HEAD)
        if CHUNK_DELAY_S:
            self._send_paced(0)
            return
        for framed in self.FRAMED:
            write(framed)
        self._end()

    def _send_paced(self, i: int) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self.transport.write(self.FRAMED[i])
        if i + 1 == len(self.FRAMED):
            self._end()
        else:
            delay = CHUNK_DELAY_S if i + 1 < len(self.FRAMED) - 1 else 0
            asyncio.get_running_loop().call_later(delay, self._send_paced, i + 1)

    def _end(self, last_chunk: bytes = b"0\r\n\r\n") -> None:
        assert self.transport is not None
        if last_chunk:
            self.transport.write(last_chunk)
        if not self.parser.should_keep_alive():
            self.transport.close()


def _apply_variant(variant: str) -> None:
    import gc

    if variant in ("no-nodelay", "lean"):
        import aiohttp.base_protocol

        aiohttp.base_protocol.tcp_nodelay = lambda transport, value: None  # type: ignore[assignment]
    if variant in ("gc-freeze", "lean"):
        gc.collect()
        gc.freeze()


async def _serve_aiohttp(port: int, variant: str) -> None:
    from aiohttp import web

    async def handle(request: web.Request) -> web.StreamResponse:
        json.loads(await request.read())
        response = web.StreamResponse(headers={k.decode(): v.decode() for k, v in HEADERS})
        await response.prepare(request)
        for i, chunk in enumerate(CHUNKS):
            await _pace(i)
            await response.write(chunk)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post(PATH, handle)
    runner = web.AppRunner(
        app, access_log=None, handler_cancellation=variant != "no-cancel", tcp_keepalive=False
    )
    await runner.setup()
    assert runner.server is not None
    await asyncio.get_running_loop().create_server(runner.server, "127.0.0.1", port, backlog=1024)
    _apply_variant(variant)
    await asyncio.Event().wait()


async def _serve_interlock(port: int, variant: str) -> None:
    from interlock.frontend.app import serve_frontend
    from interlock.frontend.backend import ModelEntry
    from interlock.frontend.connections import ConnectionTracker
    from interlock.frontend.fake import FakeBackend, FakeScript
    from interlock.model_store import resolve_model

    if variant in ("no-tracker", "lean"):  # aiohttp's own protocol, unwrapped
        ConnectionTracker.factory = lambda self, server: server  # type: ignore[assignment,method-assign,return-value]
    entry = ModelEntry(MODEL, str(resolve_model("smollm2")), 2048)
    backend = FakeBackend([entry], FakeScript(token_delay_s=CHUNK_DELAY_S), keep_history=False)
    await serve_frontend(backend, "127.0.0.1", port)
    _apply_variant(variant)
    await asyncio.Event().wait()


async def _serve_raw(port: int, variant: str) -> None:
    await asyncio.get_running_loop().create_server(RawHTTP, "127.0.0.1", port, backlog=1024)
    await asyncio.Event().wait()


def serve(name: str, variant: str, port: int) -> None:
    """Run server ``name`` in this process until killed (granian is started by its own CLI)."""
    import uvloop

    if name == "uvicorn":
        import uvicorn

        uvicorn.run(
            asgi_app,
            host="127.0.0.1",
            port=port,
            loop="uvloop",
            http="httptools",
            access_log=False,
            log_level="warning",
            backlog=1024,
        )
        return
    main = {"aiohttp": _serve_aiohttp, "aiohttp-interlock": _serve_interlock, "raw-uvloop": _serve_raw}[name]
    uvloop.run(main(port, variant))


def server_argv(name: str, variant: str, port: int, python: str) -> list[str]:
    if name.startswith("granian-"):
        interface = name.removeprefix("granian-")
        return [
            GRANIAN, "--interface", interface, "--loop", "uvloop", "--workers", "1", "--http", "1",
            "--no-ws", "--log-level", "warning", "--no-access-log", "--backlog", "1024",
            "--host", "127.0.0.1", "--port", str(port), f"http_servers:{interface}_app",
        ]  # fmt: skip
    return [python, __file__, "--serve", name, "--variant", variant, "--port", str(port)]


def start_server(spec: str, logdir: Path) -> System:
    """Start ``NAME[:VARIANT][@PYTHON]`` (PYTHON: another interpreter with aiohttp and uvloop)."""
    spec_, _, python = spec.partition("@")
    name, _, variant = spec_.partition(":")
    if name not in SERVERS or (variant and variant not in VARIANTS):
        raise SystemExit(f"unknown server {spec!r}: pick from {SERVERS}, variants {tuple(VARIANTS)}")
    port = free_port()
    env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{ROOT}"}
    log = logdir / f"{name}-{variant}-{port}.log"
    proc = _spawn(server_argv(name, variant, port, python or PYTHON), env, log)
    system = System(spec, port, proc.pid, [proc], [log])
    payload = request_bytes(port, MODEL, prompt=PROMPT, max_tokens=17)
    deadline = time.monotonic() + 60
    while True:
        try:
            body = asyncio.run(asyncio.wait_for(one_request(port, payload), 10))
            if body.startswith(b"HTTP/1.1 200") and body.count(b"data: ") >= 17:
                return system
            raise RuntimeError(f"{spec}: unexpected answer {body[:300]!r}")
        except OSError:
            if not system.alive() or time.monotonic() > deadline:
                system.stop()
                raise RuntimeError(f"{spec} did not start:\n{system.tail()}") from None
            time.sleep(0.2)


# ---------------------------------------------------------------- the load client


def cpu_split(pids: list[int]) -> tuple[float, float]:
    """(user, system) CPU seconds of ``pids`` so far, all their threads included."""
    user = system = 0
    for pid in pids:
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
            user += int(fields[11])
            system += int(fields[12])
    tick = os.sysconf("SC_CLK_TCK")
    return user / tick, system / tick


async def client(a: argparse.Namespace) -> dict[str, Any]:
    """One phase against ``a.port``; the server's CPU is read around it, in this process."""
    pids = [int(p) for p in a.pids.split(",")] if a.pids else []
    payload = request_bytes(a.port, MODEL, prompt=PROMPT, max_tokens=17)
    own0 = resource.getrusage(resource.RUSAGE_SELF)
    u0, s0 = cpu_split(pids)
    r = await run_phase(
        a.port,
        payload,
        concurrency=a.concurrency,
        requests=a.requests,
        max_seconds=a.seconds,
        keep_alive=not a.new_conn,
    )
    u1, s1 = cpu_split(pids)
    own1 = resource.getrusage(resource.RUSAGE_SELF)
    n = max(1, len(r.latencies))
    own = own1.ru_utime + own1.ru_stime - own0.ru_utime - own0.ru_stime
    return {
        "requests": len(r.latencies),
        "errors": r.errors,
        "chunks": r.chunks,
        "rps": r.rps,
        "p50": r.pct(0.5),
        "p99": r.pct(0.99),
        "user_ms": (u1 - u0) * 1000 / n,
        "sys_ms": (s1 - s0) * 1000 / n,
        "client_ms": own * 1000 / n,
    }


def run_client(
    port: int, pids: list[int], concurrency: int, keep_alive: bool, requests: int, seconds: float
) -> dict[str, Any]:
    argv = [
        PYTHON, __file__, "--client", "--port", str(port), "--pids", ",".join(map(str, pids)),
        "--concurrency", str(concurrency), "--requests", str(requests), "--seconds", str(seconds),
    ]  # fmt: skip
    if not keep_alive:
        argv.append("--new-conn")
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=seconds + 120)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


# ---------------------------------------------------------------- measuring


@dataclass
class Run:
    """One server in one round: phase name -> the client's report; RSS at the end (MiB)."""

    spec: str
    round: int
    phases: dict[str, dict[str, Any]] = field(default_factory=dict)
    rss: float = 0.0


def warm_up(system: System, requests: int) -> None:
    pids = group_pids(system)
    run_client(system.port, pids, 64, True, requests, 30)
    run_client(system.port, pids, 64, False, requests // 2, 30)


def measure(spec: str, rnd: int, a: argparse.Namespace, logdir: Path) -> Run:
    system = start_server(spec, logdir)
    try:
        warm_up(system, a.warmup)
        run = Run(spec, rnd)
        for name, concurrency, keep_alive in PHASES:
            if a.phases and name not in a.phases.split(","):
                continue
            r = run_client(system.port, group_pids(system), concurrency, keep_alive, a.requests, a.seconds)
            if r["errors"]:
                print(f"  {spec} {name}: {r['errors']} errors", file=sys.stderr)
            run.phases[name] = r
            print(
                f"  {spec} round {rnd} {name}: {r['rps']:.0f} req/s, p50 {r['p50']:.2f} ms, "
                f"CPU {r['user_ms']:.3f}+{r['sys_ms']:.3f} ms/req, chunks {r['chunks']}",
                file=sys.stderr,
            )
        run.rss = rss_mib(*group_pids(system))[0]
        return run
    finally:
        system.stop()


def versions() -> dict[str, str]:
    out = {}
    for dist in ("aiohttp", "uvloop", "uvicorn", "httptools", "granian"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def server_version(spec: str, v: dict[str, str]) -> str:
    spec_, _, python = spec.partition("@")
    name = spec_.partition(":")[0]
    where = f", run by {python}" if python else ""
    return {
        "aiohttp": f"aiohttp {v['aiohttp']}",
        "aiohttp-interlock": f"aiohttp {v['aiohttp']}",
        "uvicorn": f"uvicorn {v['uvicorn']}, httptools {v['httptools']}",
        "granian-asgi": f"granian {v['granian']}",
        "granian-rsgi": f"granian {v['granian']}",
        "raw-uvloop": f"httptools {v['httptools']}",
    }[name] + f", uvloop {v['uvloop']}{where}"


def _mean(runs: list[Run], phase: str, key: str) -> float:
    """The mean over rounds (NaN for a phase not run)."""
    values = [r.phases[phase][key] for r in runs if phase in r.phases]
    return sum(values) / len(values) if values else float("nan")


def summary(runs: list[Run], v: dict[str, str]) -> str:
    by: dict[str, list[Run]] = defaultdict(list)
    for r in runs:
        by[r.spec].append(r)
    lines = [
        "| server | version | req/s c64 keep-alive | req/s c64 new conn | CPU ms/req c64 keep-alive "
        "(user+sys) | CPU ms/req c64 new conn (user+sys) | extra CPU per new connection (ms) "
        "| p50 ms c1 keep-alive / new conn | RSS MiB |",
        "|" + "---|" * 9,
    ]
    for spec, rs in by.items():
        cpu = {}
        for phase in ("c64 keep-alive", "c64 new conn"):
            user, sys_ = _mean(rs, phase, "user_ms"), _mean(rs, phase, "sys_ms")
            cpu[phase] = (user + sys_, user, sys_)
        ka, nc = cpu["c64 keep-alive"], cpu["c64 new conn"]
        lines.append(
            f"| {spec} | {server_version(spec, v)} | {_mean(rs, 'c64 keep-alive', 'rps'):.0f} "
            f"| {_mean(rs, 'c64 new conn', 'rps'):.0f} "
            f"| {ka[0]:.3f} ({ka[1]:.3f}+{ka[2]:.3f}) | {nc[0]:.3f} ({nc[1]:.3f}+{nc[2]:.3f}) "
            f"| {nc[0] - ka[0]:.3f} ({nc[1] - ka[1]:+.3f} user, {nc[2] - ka[2]:+.3f} sys) "
            f"| {_mean(rs, 'c1 keep-alive', 'p50'):.2f} / {_mean(rs, 'c1 new conn', 'p50'):.2f} "
            f"| {sum(r.rss for r in rs) / len(rs):.0f} |"
        )
    return "\n".join(lines)


def detail(runs: list[Run]) -> str:
    lines = [
        "| server | round | phase | req/s | p50 / p99 ms | server CPU ms/req user + sys = total "
        "| client CPU ms/req | chunks | errors |",
        "|" + "---|" * 9,
    ]
    for r in runs:
        for phase, p in r.phases.items():
            lines.append(
                f"| {r.spec} | {r.round} | {phase} | {p['rps']:.0f} | {p['p50']:.2f} / {p['p99']:.2f} "
                f"| {p['user_ms']:.3f} + {p['sys_ms']:.3f} = {p['user_ms'] + p['sys_ms']:.3f} "
                f"| {p['client_ms']:.3f} | {p['chunks'][0]}-{p['chunks'][1]} | {p['errors']} |"
            )
    return "\n".join(lines)


def header(argv: list[str]) -> str:
    cpu = "?"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                cpu = line.split(":", 1)[1].strip()
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f"CPU: {cpu} ({os.cpu_count()} vCPU), Python {platform.python_version()}, {now}\n"
        f"Command: `.venv/bin/python benchmarks/{Path(argv[0]).name} {' '.join(argv[1:])}`"
    )


# ---------------------------------------------------------------- profiling one server


PERF_ENTRY_POINTS = (  # label, symbol: inclusive CPU (rows overlap: indented ones are inside)
    (
        "accept: uvloop's accept, transport, protocol factory",
        "__pyx_f_6uvloop_4loop_14UVStreamServer__on_listen",
    ),
    ("  accept4(2)", "__x64_sys_accept4"),
    ("protocol.connection_made", "__pyx_f_6uvloop_4loop_15UVBaseTransport__call_connection_made"),
    (
        "  tcp_nodelay: setsockopt through uvloop's PseudoSocket",
        "__pyx_pw_6uvloop_4loop_12PseudoSocket_19setsockopt",
    ),
    ("  tcp_nodelay: PseudoSocket.family", "__pyx_getprop_6uvloop_4loop_12PseudoSocket_family"),
    ("  keep-alive timer: loop.call_at", "__pyx_pw_6uvloop_4loop_4Loop_19call_at"),
    ("protocol.connection_lost", "__pyx_f_6uvloop_4loop_15UVBaseTransport__call_connection_lost"),
    ("close(2)", "__x64_sys_close"),
    ("epoll_ctl (libuv batches it through io_uring)", "__do_sys_io_uring_enter"),
    ("write(2): TCP send, and the loopback receive in softirq", "ksys_write"),
    ("read(2)", "ksys_read"),
    ("HTTP parser feed_data", "__pyx_pw_7aiohttp_12_http_parser_10HttpParser_11feed_data"),
    ("task deallocation", "TaskObj_dealloc"),
    ("exception deallocation (CancelledError)", "BaseException_dealloc"),
    ("cyclic GC", "gc_collect_main"),
)


def _perf_record(pids: list[int], out: Path) -> subprocess.Popen[bytes]:
    """One sample per PERF_PERIOD_NS of the server's CPU, kernel included, with DWARF call chains
    (Python 3.11 keeps no frame pointers) so native entry points get their inclusive time."""
    argv = [
        "perf",
        "record",
        "-q",
        "--call-graph",
        "dwarf,8192",
        "-e",
        "cpu-clock",
        "-c",
        str(PERF_PERIOD_NS),
    ]
    argv += ["-o", str(out), "-p", ",".join(map(str, pids))]
    with open(out.with_suffix(".log"), "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    time.sleep(1.5)  # attached
    return proc


def _perf_report(data: Path, requests: int) -> dict[str, tuple[float, float]]:
    """Per symbol: (inclusive, self) microseconds of CPU per request."""
    argv = ["perf", "report", "-i", str(data), "--stdio", "--children", "--sort", "sym", "-g", "none"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    total_us = 0.0
    rows: dict[str, tuple[float, float]] = {}
    for line in out.splitlines():
        if line.startswith("# Event count (approx.):"):
            total_us = int(line.rpartition(":")[2]) / 1000 / requests
        parts = line.split(None, 3)
        if len(parts) == 4 and parts[0].endswith("%") and parts[2].startswith("["):
            sym = parts[3].removesuffix(" (inlined)").strip()
            children, self_ = (float(x.rstrip("%")) * total_us / 100 for x in parts[:2])
            rows.setdefault(sym, (children, self_))
    rows["(all)"] = (total_us, total_us)
    return rows


def profile(spec: str, a: argparse.Namespace, logdir: Path) -> str:
    """The server's CPU per request by native entry point and by symbol, keep-alive against a
    new connection per request, both at concurrency 64; the difference is one connection's."""
    system = start_server(spec, logdir)
    per_request: dict[str, dict[str, tuple[float, float]]] = {}
    try:
        warm_up(system, a.warmup)
        for phase, keep_alive in (("keep-alive", True), ("new conn", False)):
            pids = group_pids(system)
            out = logdir / f"{system.frontend_pid}-{phase.replace(' ', '-')}.perf"
            prof = _perf_record(pids, out)
            r = run_client(system.port, pids, 64, keep_alive, a.requests, a.seconds)
            prof.send_signal(signal.SIGINT)
            prof.wait(120)
            per_request[phase] = _perf_report(out, r["requests"])
            print(
                f"  {spec} {phase}: {r['requests']} requests, {r['user_ms'] + r['sys_ms']:.3f} ms/req",
                file=sys.stderr,
            )
    finally:
        system.stop()
    ka, nc = per_request["keep-alive"], per_request["new conn"]
    zero = (0.0, 0.0)
    lines = [
        f"{spec}: server CPU per request in us (perf, profiled), c=64; inclusive, rows overlap",
        "| where | keep-alive | new conn | per new connection |",
        "|---|---|---|---|",
    ]
    for label, sym in (("all", "(all)"), *PERF_ENTRY_POINTS):
        x, y = ka.get(sym, zero)[0], nc.get(sym, zero)[0]
        lines.append(f"| {label} | {x:.1f} | {y:.1f} | {y - x:+.1f} |")
    lines += [
        "",
        f"{spec}: self time per request in us, the {a.top} largest increases",
        "| symbol | keep-alive | new conn | per new connection |",
        "|---|---|---|---|",
    ]
    rows = sorted(
        set(ka) - {"(all)"} | set(nc) - {"(all)"},
        key=lambda k: nc.get(k, zero)[1] - ka.get(k, zero)[1],
        reverse=True,
    )
    for k in rows[: a.top]:
        x, y = ka.get(k, zero)[1], nc.get(k, zero)[1]
        lines.append(f"| `{k[:90]}` | {x:.1f} | {y:.1f} | {y - x:+.1f} |")
    return "\n".join(lines)


# ---------------------------------------------------------------- main


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--servers", default=",".join(SERVERS), help="comma-separated NAME[:VARIANT][@PYTHON]")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--requests", type=int, default=5000, help="per phase")
    p.add_argument("--seconds", type=float, default=10.0, help="per phase at most")
    p.add_argument("--warmup", type=int, default=1000, help="keep-alive requests (and half as many new)")
    p.add_argument("--chunk-delay-ms", type=float, default=0.0, help="pause between data chunks")
    p.add_argument("--phases", default="", help="comma-separated phase names (default: all)")
    p.add_argument("--profile", action="store_true", help="profile the c=64 phases with perf instead")
    p.add_argument("--top", type=int, default=25, help="symbols listed per profile")
    p.add_argument("--logdir", help="server logs and profiles (default: a temporary folder)")
    # internal: one server, or one client phase
    p.add_argument("--serve", help=argparse.SUPPRESS)
    p.add_argument("--variant", default="", help=argparse.SUPPRESS)
    p.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--pids", default="", help=argparse.SUPPRESS)
    p.add_argument("--concurrency", type=int, default=64, help=argparse.SUPPRESS)
    p.add_argument("--new-conn", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args()


def main() -> None:
    a = parse_args()
    if a.serve:
        serve(a.serve, a.variant, a.port)
        return
    if a.client:
        import uvloop

        print(json.dumps(uvloop.run(client(a))))
        return
    os.environ["HTTP_SERVERS_CHUNK_DELAY_MS"] = str(a.chunk_delay_ms)  # the servers' CHUNK_DELAY_S
    logdir = Path(a.logdir or tempfile.mkdtemp(prefix="http-servers-"))
    logdir.mkdir(parents=True, exist_ok=True)
    specs = [s for s in a.servers.split(",") if s]
    print(header(sys.argv) + "\n")
    if a.profile:
        for spec in specs:
            print(profile(spec, a, logdir) + "\n")
        return
    runs = [measure(spec, rnd, a, logdir) for rnd in range(1, a.rounds + 1) for spec in specs]
    v = versions()
    print(summary(runs, v) + "\n")
    print(detail(runs))
    print(f"\nVersions: {', '.join(f'{k} {x}' for k, x in v.items())}; server logs in {logdir}")


if __name__ == "__main__":
    main()
