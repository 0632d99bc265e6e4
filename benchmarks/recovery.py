"""Fault tolerance: recovery after a worker is SIGKILLed mid-stream, Interlock against Dynamo 1.6.1.

Per system, per repetition (each on a freshly started system of two workers):

1. a warm-up request, then an undisturbed *baseline* run: N streaming chat completions sent at
   once (``ignore_eos``, ``max_tokens`` tokens each, usage requested);
2. the *kill* run: the same load again, and ``--kill-at`` seconds after it started (once every
   stream has its first token) one worker process is SIGKILLed.

Per request the client records success, the completion-token count (usage chunk; anything but
exactly ``max_tokens`` is a failure, as is a non-200 status, an error event or a missing
``[DONE]``), the arrival time of every token event and the end-to-end latency.

* **migrated** requests: for Interlock those whose first worker (``x-interlock-route``, asked for
  with ``x-interlock-explain: 1``) is the killed one; for Dynamo, which names no worker, the k
  requests with the largest token gap after the kill, k = the "migration retry" lines in its
  frontend's log (a gap threshold alone also catches requests on the surviving worker, which
  stall for the re-prefill of the migrated ones; requests whose gap exceeds ``--gap-threshold``
  are printed per run as a cross-check).
* **recovery** of a migrated request: the largest gap between two consecutive tokens the client
  saw whose later token arrived after the kill (the stall the migration caused; "kill to next
  token" is printed per run too, but tokens already in flight at the kill make it too small).
* **e2e added**: p50 (p99) end-to-end latency of the migrated requests minus the p50 (p99) of
  all requests of the baseline runs, pooled over repetitions.

Systems (all with two workers on loopback):

* ``interlock-mock``: ``interlock serve --runner mock --speedup 1``, Interlock's defaults for
  migration (``--migration-limit 3``, stall timeout) and routing (kv); ``--block-size 64
  --num-blocks 16384`` so that its timing model (``engine.timing``, Dynamo's polynomial fit,
  decode time a function of KV usage) sees the same KV usage as Dynamo's mocker at its default
  capacity (16,384 blocks of 64).
* ``interlock-mock-rr``: the same with ``--policy round-robin``, Dynamo's policy here: 8 and 8.
* ``interlock-smollm2``: ``interlock serve --runner torch`` with SmolLM2-135M on the CPU.
* ``dynamo``: ``dynamo.frontend --migration-limit 3`` (``--router-mode``, default round-robin)
  and two ``dynamo.mocker --speedup-ratio 1`` workers with file discovery and the TCP request
  plane, as in /work/shared/anchors/dynamo.md; Dynamo must be installed in /tmp/dynamo-venv.

    python benchmarks/recovery.py                       # all three, 3 repetitions each
    python benchmarks/recovery.py --systems interlock-mock,dynamo --reps 1

Run it from the repository root so that this checkout's ``interlock`` is imported (workers
inherit the working directory). Every process is started in its own session and killed at the
end, also on error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import framework_overhead
from framework_overhead import DYNAMO_PY, System, free_port, machine, running

ROOT = Path(__file__).resolve().parents[1]
TOPICS = (
    "the sea",
    "mountains",
    "rivers",
    "deserts",
    "forests",
    "glaciers",
    "volcanoes",
    "islands",
    "caves",
    "lakes",
    "storms",
    "the moon",
    "comets",
    "coral reefs",
    "tundra",
    "savannas",
)


# ---------------------------------------------------------------- systems


@dataclass(frozen=True)
class Spec:
    name: str
    max_tokens: int
    kill_at: float
    """Seconds after the kill run's requests were sent (at least: once every stream is flowing)."""
    gap_threshold: float
    """A token gap across the kill above this marks a request as migrated (Dynamo; a cross-check)."""


def start_interlock(runner: str, model: str, logdir: Path, extra: list[str]) -> System:
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    argv = [
        sys.executable,
        "-m",
        "interlock.cli.main",
        "serve",
        "--runner",
        runner,
        "--workers",
        "2",
        "--model",
        model,
        "--port",
        str(port),
        "--log-level",
        "WARNING",
        *extra,
    ]
    log = logdir / f"interlock_{runner}.log"
    with open(log, "wb") as f:
        p = subprocess.Popen(
            argv,
            env=env,
            cwd=ROOT,
            stdout=f,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return System(f"interlock {runner}", port, p.pid, [p], [log])


def start_dynamo(model: str, served: str, logdir: Path, router_mode: str, migration_limit: int) -> System:
    return framework_overhead.start_dynamo(
        model,
        served,
        logdir,
        router_mode,
        speedup="1",
        log_level="info",
        frontend_args=("--migration-limit", str(migration_limit)),
        name="dynamo 1.6.1 mocker",
    )


def interlock_worker_pid(system: System, instance_id: str) -> int:
    """The pid of the ``interlock worker`` with this instance id in the serve process's group."""
    group = system.procs[0].pid
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            if os.getpgid(int(entry.name)) != group:
                continue
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            # `interlock worker ... --instance-id ID` or the builder's `-m interlock.cluster.worker_main ID`
            if instance_id.encode() in argv and any(b"worker" in arg for arg in argv):
                return int(entry.name)
    raise RuntimeError(f"no worker process with instance id {instance_id}")


# ---------------------------------------------------------------- the client


@dataclass
class Result:
    index: int
    sent: float
    ok: bool = False
    error: str = ""
    tokens: int | None = None
    worker: str | None = None
    times: list[float] = field(default_factory=list)
    """Arrival time of every event that carried a choice (a token), perf_counter seconds."""
    done: float = 0.0

    @property
    def e2e(self) -> float:
        return self.done - self.sent

    def max_gap(self) -> float:
        return max((b - a for a, b in zip(self.times, self.times[1:], strict=False)), default=0.0)

    def gap_after(self, t: float) -> float:
        """The largest gap between consecutive tokens whose later one arrived after ``t``.

        For a migrated request this is its recovery as the client saw it: tokens the killed
        worker produced before the kill may still arrive after it (they were in flight), so
        "kill to next token" alone can miss the stall."""
        return max((b - a for a, b in zip(self.times, self.times[1:], strict=False) if b > t), default=0.0)

    def next_after(self, t: float) -> float | None:
        return next((x for x in self.times if x > t), None)


def request_bytes(port: int, model: str, index: int, max_tokens: int) -> bytes:
    body = {
        "model": model,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.0,
        "messages": [
            {
                "role": "user",
                "content": f"Request {index}: tell me a long story about {TOPICS[index % len(TOPICS)]}.",
            }
        ],
    }
    raw = json.dumps(body, separators=(",", ":")).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nAccept: text/event-stream\r\nConnection: close\r\n"
        f"x-interlock-explain: 1\r\nContent-Length: {len(raw)}\r\n\r\n"
    )
    return head.encode() + raw


_ROUTE = re.compile(rb"^x-interlock-route:.*?worker=([^;\r\n]+)", re.I | re.M)


async def stream_one(
    r: Result, port: int, model: str, max_tokens: int, timeout_s: float, started: asyncio.Event | None = None
) -> Result:
    r.sent = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s):
            await _stream(r, port, model, max_tokens, started)
    except (OSError, ConnectionError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
        r.error = r.error or f"{type(exc).__name__}: {exc}"
    r.done = time.perf_counter()
    r.ok = not r.error and r.tokens == max_tokens
    if not r.ok and not r.error:
        r.error = f"{r.tokens} completion tokens, expected {max_tokens}"
    return r


async def _stream(r: Result, port: int, model: str, max_tokens: int, started: asyncio.Event | None) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request_bytes(port, model, r.index, max_tokens))
        head = await reader.readuntil(b"\r\n\r\n")
        m = _ROUTE.search(head)
        r.worker = m.group(1).decode().strip() if m else None
        if not head.startswith(b"HTTP/1.1 200"):
            r.error = (
                head.split(b"\r\n", 1)[0].decode(errors="replace")
                + " "
                + (await reader.read(300)).decode(errors="replace")
            )
            return
        buf = b""
        finished = False
        while not finished:
            data = await reader.read(65536)
            now = time.perf_counter()
            if not data:
                break
            *lines, buf = (buf + data).split(b"\n")
            for line in lines:
                if not line.startswith(b"data: "):
                    continue
                if line.startswith(b"data: [DONE]"):
                    finished = True
                    continue
                ev = json.loads(line[6:])
                if "error" in ev:
                    r.error = f"error event: {json.dumps(ev['error'])[:200]}"
                if ev.get("choices"):
                    r.times.append(now)
                    if started is not None and len(r.times) == 1:
                        started.set()
                if ev.get("usage"):
                    r.tokens = int(ev["usage"]["completion_tokens"])
        if not finished and not r.error:
            r.error = "stream ended without [DONE]"
    finally:
        writer.close()
        with contextlib.suppress(OSError, ConnectionError):
            await writer.wait_closed()


async def run_load(
    port: int,
    model: str,
    n: int,
    max_tokens: int,
    timeout_s: float,
    kill: Callable[[list[Result]], float] | None = None,
    kill_at: float = 0.0,
) -> tuple[list[Result], float | None]:
    """N requests at once. ``kill`` is called ``kill_at`` s after they were sent, once every
    stream has its first token, with the results so far (first workers known); it returns the
    kill's ``perf_counter`` time."""
    events = [asyncio.Event() for _ in range(n)]
    results = [Result(i, 0.0) for i in range(n)]
    t0 = time.perf_counter()
    tasks = [
        asyncio.create_task(stream_one(results[i], port, model, max_tokens, timeout_s, events[i]))
        for i in range(n)
    ]
    killed_at = None
    if kill is not None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await asyncio.gather(*(e.wait() for e in events))
        await asyncio.sleep(max(0.0, t0 + kill_at - time.perf_counter()))
        killed_at = kill(results)
    return list(await asyncio.gather(*tasks)), killed_at


# ---------------------------------------------------------------- one system, one repetition


@dataclass
class Rep:
    system: str
    baseline: list[Result]
    killed: list[Result]
    kill_time: float
    victim: str
    migrated: list[Result]
    migrated_by_gap: list[Result]
    note: str = ""


async def wait_ready(system: System, model: str, max_tokens: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        if not system.alive():
            raise RuntimeError(f"{system.name} exited during start-up\n{system.tail()}")
        r = await stream_one(Result(0, 0.0), system.port, model, max_tokens, 60)
        if r.ok:
            return
        last = r.error
        await asyncio.sleep(1.0)
    raise RuntimeError(f"{system.name} not ready after {timeout_s:.0f}s: {last}\n{system.tail()}")


async def measure(system: System, spec: Spec, model: str, a: argparse.Namespace) -> Rep:
    await wait_ready(system, model, spec.max_tokens, a.ready_timeout)
    await run_load(system.port, model, 2, spec.max_tokens, a.timeout)  # warm-up
    base, _ = await run_load(system.port, model, a.concurrency, spec.max_tokens, a.timeout)
    await asyncio.sleep(1.0)
    is_interlock = spec.name.startswith("interlock")
    victim = ""

    def kill(results: list[Result]) -> float:
        nonlocal victim
        if is_interlock:  # the worker most requests went to (ties: the first by name)
            counts: dict[str, int] = {}
            for r in results:
                if r.worker is not None:
                    counts[r.worker] = counts.get(r.worker, 0) + 1
            victim = max(sorted(counts), key=lambda w: counts[w])
            pid = interlock_worker_pid(system, victim)
            t = time.perf_counter()
            os.kill(pid, signal.SIGKILL)
        else:
            mocker = system.procs[0]
            victim = f"mocker0 pid {mocker.pid}"
            t = time.perf_counter()
            os.killpg(mocker.pid, signal.SIGKILL)
        return t

    killed, t_kill = await run_load(
        system.port, model, a.concurrency, spec.max_tokens, a.timeout, kill, spec.kill_at
    )
    assert t_kill is not None
    by_gap = [r for r in killed if r.gap_after(t_kill) > spec.gap_threshold or not r.ok]
    migrated = [r for r in killed if r.worker == victim] if is_interlock else by_gap
    return Rep(spec.name, base, killed, t_kill, victim, migrated, by_gap)


# ---------------------------------------------------------------- report


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    if not xs:
        return float("nan")
    pos = (len(xs) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def recovery_s(rep: Rep) -> list[float]:
    return [r.gap_after(rep.kill_time) for r in rep.migrated if r.ok]


def kill_to_next_s(rep: Rep) -> list[float]:
    return [
        t - rep.kill_time for r in rep.migrated if r.ok and (t := r.next_after(rep.kill_time)) is not None
    ]


def rep_line(rep: Rep, log_hits: int) -> str:
    failed = [r for r in rep.killed if not r.ok]
    base_failed = [r for r in rep.baseline if not r.ok]
    rec = recovery_s(rep)
    e2e_b = [r.e2e for r in rep.baseline if r.ok]
    e2e_m = [r.e2e for r in rep.migrated if r.ok]
    after = [
        (r.times[-1] - t) / max(1, sum(x > t for x in r.times) - 1)
        for r in rep.migrated
        if (t := r.next_after(rep.kill_time)) is not None
    ]
    errors = sorted({r.error for r in failed})
    spread = {}
    for r in rep.killed:
        spread[r.worker or "?"] = spread.get(r.worker or "?", 0) + 1
    return (
        f"  {rep.system}: killed {rep.victim}; failed {len(failed)}/{len(rep.killed)} "
        f"(baseline {len(base_failed)}); migrated {len(rep.migrated)} (by gap {len(rep.migrated_by_gap)}, "
        f"log lines {log_hits}); first workers {dict(sorted(spread.items()))}; recovery ms {[round(x * 1000) for x in sorted(rec)]}; "
        f"kill to next token ms {[round(x * 1000) for x in sorted(kill_to_next_s(rep))]}; "
        f"e2e p50 baseline {pct(e2e_b, 0.5) * 1000:.0f} migrated {pct(e2e_m, 0.5) * 1000:.0f} ms; "
        f"ms/token after recovery p50 {pct(after, 0.5) * 1000:.1f}" + (f"; errors {errors}" if errors else "")
    )


def table(reps: list[Rep], names: list[str]) -> str:
    lines = [
        "| system | runs | failed / total | migrated | recovery p50 / p99 ms | "
        "e2e baseline p50 / p99 ms | e2e migrated p50 / p99 ms | e2e added p50 / p99 ms |",
        "|" + "---|" * 8,
    ]
    for name in names:
        mine = [r for r in reps if r.system == name]
        if not mine:
            continue
        killed = [x for r in mine for x in r.killed]
        failed = sum(not x.ok for x in killed)
        rec = [x * 1000 for r in mine for x in recovery_s(r)]
        base = [x.e2e * 1000 for r in mine for x in r.baseline if x.ok]
        mig = [x.e2e * 1000 for r in mine for x in r.migrated if x.ok]
        lines.append(
            f"| {name} | {len(mine)} | {failed} / {len(killed)} | {sum(len(r.migrated) for r in mine)} "
            f"| {pct(rec, 0.5):.0f} / {pct(rec, 0.99):.0f} "
            f"| {pct(base, 0.5):.0f} / {pct(base, 0.99):.0f} | {pct(mig, 0.5):.0f} / {pct(mig, 0.99):.0f} "
            f"| {pct(mig, 0.5) - pct(base, 0.5):.0f} / {pct(mig, 0.99) - pct(base, 0.99):.0f} |"
        )
    return "\n".join(lines)


def cpu_model() -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    return "?"


def log_hits(system: System, pattern: str) -> int:
    """Matches of ``pattern`` in the system's logs (its migrations, as the system reports them)."""
    n = 0
    for log in system.logs:
        with contextlib.suppress(OSError):
            n += len(re.findall(pattern, log.read_text(errors="replace")))
    return n


MIGRATION_LOG = {"interlock": r"migrating request", "dynamo": r"(?i)migrat\w* retry"}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--systems",
        default="interlock-mock,interlock-mock-rr,dynamo,interlock-smollm2",
        help="comma-separated: interlock-mock, interlock-mock-rr, interlock-smollm2, dynamo",
    )
    p.add_argument("--reps", type=int, default=3, help="repetitions per system, interleaved")
    p.add_argument("--concurrency", type=int, default=16, help="requests per run, all sent at once")
    p.add_argument("--mock-tokens", type=int, default=300)
    p.add_argument("--smollm2-tokens", type=int, default=64)
    p.add_argument("--kill-at", type=float, default=1.5, help="seconds into the kill run (mock systems)")
    p.add_argument("--smollm2-kill-at", type=float, default=1.5)
    p.add_argument(
        "--gap-threshold", type=float, default=0.05, help="seconds; mock systems (SmolLM2: 5x this)"
    )
    p.add_argument("--interlock-args", default="", help="extra `interlock serve` flags (diagnosis)")
    p.add_argument("--dynamo-router-mode", default="round-robin")
    p.add_argument("--dynamo-migration-limit", type=int, default=3)
    p.add_argument("--timeout", type=float, default=120.0, help="per request")
    p.add_argument("--ready-timeout", type=float, default=240.0)
    p.add_argument("--seed", type=int, default=0, help="seeds the port choice (prompts are fixed)")
    p.add_argument("--logdir", default=None, help="server logs (default: a temporary folder)")
    return p.parse_args()


async def main_async(a: argparse.Namespace) -> tuple[list[Rep], list[str]]:
    from interlock.model_store import resolve_model, served_model_name

    model_dir = str(resolve_model("smollm2"))
    served = served_model_name(model_dir)
    logdir = Path(a.logdir or tempfile.mkdtemp(prefix="recovery-logs-"))
    logdir.mkdir(parents=True, exist_ok=True)
    mock_flags = ["--speedup", "1", "--block-size", "64", "--num-blocks", "16384"]
    systems: dict[str, tuple[Spec, Callable[[], System]]] = {
        "interlock-mock": (
            Spec("interlock mock", a.mock_tokens, a.kill_at, a.gap_threshold),
            lambda: start_interlock("mock", model_dir, logdir, mock_flags + a.interlock_args.split()),
        ),
        "interlock-mock-rr": (
            Spec("interlock mock, round-robin", a.mock_tokens, a.kill_at, a.gap_threshold),
            lambda: start_interlock(
                "mock", model_dir, logdir, mock_flags + ["--policy", "round-robin", *a.interlock_args.split()]
            ),
        ),
        "interlock-smollm2": (
            Spec("interlock smollm2", a.smollm2_tokens, a.smollm2_kill_at, 5 * a.gap_threshold),
            lambda: start_interlock("torch", model_dir, logdir, a.interlock_args.split()),
        ),
        "dynamo": (
            Spec("dynamo mocker", a.mock_tokens, a.kill_at, a.gap_threshold),
            lambda: start_dynamo(model_dir, served, logdir, a.dynamo_router_mode, a.dynamo_migration_limit),
        ),
    }
    names = [s.strip() for s in a.systems.split(",") if s.strip()]
    unknown = set(names) - set(systems)
    if unknown:
        raise SystemExit(f"unknown systems: {sorted(unknown)}")
    if "dynamo" in names and not Path(DYNAMO_PY).exists():
        raise SystemExit(f"{DYNAMO_PY} missing: install Dynamo as in /work/shared/anchors/dynamo.md")
    print(f"model {model_dir} served as {served}; logs in {logdir}", flush=True)
    reps: list[Rep] = []
    for rep in range(a.reps):
        for name in names:
            spec, start = systems[name]
            t0 = time.monotonic()
            with running(start) as system:
                r = await measure(system, spec, served, a)
            hits = log_hits(system, MIGRATION_LOG[name.split("-")[0]])
            if name == "dynamo":  # its log counts the migrations; the largest gaps say which ones
                r.migrated = (
                    sorted(r.killed, key=lambda x: (not x.ok, x.gap_after(r.kill_time)))[-hits:]
                    if hits
                    else r.migrated_by_gap
                )
            reps.append(r)
            print(f"rep {rep + 1} ({time.monotonic() - t0:.0f} s):" + rep_line(r, hits)[1:], flush=True)
            for log in system.logs:  # the next repetition starts new ones
                log.rename(log.with_name(f"{log.stem}_rep{rep + 1}.log"))
    return reps, [systems[n][0].name for n in names]


def main() -> None:
    a = parse_args()
    random.seed(a.seed)

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # runs the finally blocks that stop every process

    signal.signal(signal.SIGTERM, interrupted)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    t0 = time.monotonic()
    reps, names = asyncio.run(main_async(a))
    print()
    print(
        f"{started}; {time.monotonic() - t0:.0f} s; {machine()}; CPU model: {cpu_model()}; "
        f"load {os.getloadavg()[0]:.1f}"
    )
    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}")
    print(table(reps, names))


if __name__ == "__main__":
    main()
