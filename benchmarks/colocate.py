"""Two models in one worker process: memory against their budgets, and the time to first token
of a request that brings an offloaded model back, beside a warm one and a cold start.

Usage: ``.venv/bin/python benchmarks/colocate.py [--offload-after 3] [--rounds 3]``

Starts ``interlock serve -f`` with SmolLM2 as the host model and a copy with other weights as
the guest (``model_store.variant``), in one worker process, each with its own KV budget; the
guest drops its weights after ``--offload-after`` seconds idle. Measures the worker's resident
memory with both loaded and with the guest out, the guest's TTFT warm (median of 5) and on the
request after each offload (``--rounds``), then a cold start: ``interlock serve`` of the guest
alone, from launch to its first token. Markdown to stdout, with the CPU's name.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import openai
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from interlock.cluster.spec import ClusterSpec, process_needs, resolve_groups, worker_specs  # noqa: E402
from interlock.deploy import load_deployment  # noqa: E402
from interlock.model_store import footprint, resolve_model  # noqa: E402
from interlock.model_store.variant import make_variant  # noqa: E402

HOST_KV_GIB, GUEST_KV_GIB = 0.25, 0.125


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Serve:
    def __init__(self, *args: str) -> None:
        with socket.socket() as probe:  # a free port of loopback
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        env = {**os.environ, "INTERLOCK_LOG_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1"}
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "interlock.cli.main", "serve", "--port", str(self.port), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,
        )
        self.ready = threading.Event()
        threading.Thread(target=self._pump, daemon=True).start()
        if not self.ready.wait(600):
            self.stop()
            raise SystemExit("interlock serve did not become ready")
        self.ready_s = time.perf_counter() - self.started
        self.client = openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="x", max_retries=0)

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if "Interlock serving" in line:
                self.ready.set()

    def worker(self) -> int:
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            for pid in (task / "children").read_text().split():
                if b"worker_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return int(pid)
        raise SystemExit("no worker process")

    def ttft(self, model: str) -> float:
        t0 = time.perf_counter()
        for chunk in self.client.completions.create(
            model=model, prompt="The capital of France is", max_tokens=4, temperature=0, stream=True
        ):
            if chunk.choices and chunk.choices[0].text:
                return time.perf_counter() - t0
        raise SystemExit("no token")

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(60)


def placement_mib(path: Path) -> tuple[float, str]:
    """What placement counts for the deployment's one worker (``cluster.spec.process_needs``:
    the models' weights as the engine measured them when they loaded, else their files), and
    those measured weights."""
    d = load_deployment(path)
    groups = resolve_groups(d, progress=False)
    (ws,) = worker_specs(ClusterSpec(deployment=d), groups)
    loaded = [
        footprint.measured(rg.model_path, s.engine.model.dtype)
        for s, rg in ((ws, groups[0]), *zip(ws.colocated, groups[0].colocated, strict=True))
    ]
    shown = " / ".join(f"{b / (1 << 20):.0f} MiB" if b else "not measured" for b in loaded)
    return process_needs(ws, groups[0]).memory_bytes / (1 << 20), shown


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--offload-after", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="interlock-colocate-"))
    source = resolve_model("smollm2", progress=False)
    guest = make_variant(source, tmp / "variant")
    deployment = {
        "execution-group": {
            "model": "smollm2",
            "served_model_name": "host",
            "nodes": [{"count": 1, "kv_cache_gib": HOST_KV_GIB}],
            "colocate": [
                {
                    "model": str(guest),
                    "served_model_name": "guest",
                    "offload_after_s": args.offload_after,
                    "nodes": [{"kv_cache_gib": GUEST_KV_GIB}],
                }
            ],
        }
    }
    (tmp / "d.yaml").write_text(yaml.safe_dump(deployment))
    serve = Serve("-f", str(tmp / "d.yaml"))
    try:
        worker = serve.worker()
        serve.ttft("host"), serve.ttft("guest")
        warm = statistics.median(serve.ttft("guest") for _ in range(5))
        loaded = rss_mib(worker)
        back, out = [], []
        for _ in range(args.rounds):
            deadline = time.monotonic() + args.offload_after + 60
            while rss_mib(worker) > loaded - 100 and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(0.5)
            out.append(rss_mib(worker))
            back.append(serve.ttft("guest"))
            serve.ttft("host")
            loaded = max(loaded, rss_mib(worker))
    finally:
        serve.stop()
    cold = Serve("--model", str(guest), "--workers", "1", "--kv-cache-gib", str(GUEST_KV_GIB))
    try:
        first = cold.ttft(cold.client.models.list().data[0].id)
    finally:
        cold.stop()
    weights = (source / "model.safetensors").stat().st_size / (1 << 20)
    budget, measured = placement_mib(tmp / "d.yaml")
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores; {time.strftime('%Y-%m-%d %H:%M')}")
    print()
    print("| figure | value |")
    print("|---|---|")
    print(f"| weights file a model | {weights:.0f} MiB |")
    print(f"| KV budgets (host, guest) | {HOST_KV_GIB * 1024:.0f} + {GUEST_KV_GIB * 1024:.0f} MiB |")
    print(f"| weights as loaded (every kernel layout), host / guest | {measured} |")
    print(f"| what placement counts for the worker (process, weights, KV) | {budget:.0f} MiB |")
    print(f"| worker RSS, both loaded | {loaded:.0f} MiB |")
    print(f"| worker RSS, guest offloaded | {statistics.median(out):.0f} MiB |")
    print(f"| guest TTFT warm (median of 5) | {warm * 1e3:.0f} ms |")
    print(f"| guest TTFT after offload (median of {args.rounds}) | {statistics.median(back) * 1e3:.0f} ms |")
    print(f"| cold start of the guest alone: launch to ready | {cold.ready_s:.1f} s |")
    print(f"| cold start: + its first request's TTFT | {first * 1e3:.0f} ms |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
