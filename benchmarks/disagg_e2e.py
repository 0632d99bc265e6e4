"""End to end on this CPU with SmolLM2: 1 prefill + 1 decode worker against 2 aggregated workers.

    .venv/bin/python benchmarks/disagg_e2e.py [--requests 40] [--rate 0.5] [--modes agg,cond,enforced]

For each setup it writes a deployment file, starts ``interlock serve -f <file>``, replays one
mixed trace with ``interlock bench --trace`` (token-exact prompts, completions API), stops the
server, and reports TTFT and ITL p50/p99 overall and for long (2,000-token) and short prompts
apart. ITL here is per token: the gaps between streamed chunks. Every 4th request is long.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_trace(
    path: Path, n: int, rate: float, long_len: int, short_len: int, out_len: int, seed: int
) -> None:
    rng = random.Random(seed)
    t = 0.0
    with path.open("w") as f:
        for i in range(n):
            f.write(
                json.dumps(
                    {
                        "timestamp": round(t * 1000),
                        "input_length": long_len if i % 4 == 0 else short_len,
                        "output_length": out_len,
                        "hash_ids": [],
                    }
                )
                + "\n"
            )
            t += rng.expovariate(rate)


DEPLOY = """control-plane: {{listen-port: {port}}}
routing: {{enforce-disagg: {enforce}}}
execution-group:
  model: smollm2
  runner: torch
  block-size: 16
  max-model-len: 2304
  nodes:
{nodes}
"""
NODE = "    - {{node-role: {role}, count: {count}, max-num-batched-tokens: 512, kv-cache-gib: 0.5}}\n"


def deployment(mode: str, port: int) -> str:
    if mode == "agg":
        nodes = NODE.format(role="both", count=2)
    else:
        nodes = NODE.format(role="prefill", count=1) + NODE.format(role="decode", count=1)
    return DEPLOY.format(port=port, enforce=str(mode == "enforced").lower(), nodes=nodes.rstrip("\n"))


def serve(deploy: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "INTERLOCK_LOG_LEVEL": "WARNING"}
    proc = subprocess.Popen(
        [PY, "-m", "interlock.cli.main", "serve", "-f", str(deploy)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    deadline = time.time() + 600
    for line in proc.stdout:
        if "Interlock serving" in line:
            return proc
        if time.time() > deadline:
            break
    proc.kill()
    raise RuntimeError("interlock serve did not become ready")


def stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))] if xs else float("nan")


def figures(results: Path, long_len: int) -> dict[str, dict[str, float]]:
    doc = json.loads(results.read_text())
    recs = [r for run in doc["runs"] for r in run["requests"]]
    out: dict[str, dict[str, float]] = {}
    for name, sel in (
        ("all", lambda r: True),
        ("long", lambda r: r["input_tokens"] >= long_len),
        ("short", lambda r: r["input_tokens"] < long_len),
    ):
        ok = [r for r in recs if sel(r) and r["error"] is None and r["ttft_s"] is not None]
        ttft = [r["ttft_s"] * 1e3 for r in ok]
        gaps = [
            (b - a) * 1e3
            for r in ok
            for a, b in zip(r["chunk_times_s"], r["chunk_times_s"][1:], strict=False)
        ]
        out[name] = {
            "n": len(ok),
            "errors": sum(1 for r in recs if sel(r)) - len(ok),
            "ttft_p50": pct(ttft, 50),
            "ttft_p99": pct(ttft, 99),
            "itl_p50": pct(gaps, 50),
            "itl_p99": pct(gaps, 99),
        }
    return out


def disagg_counters(port: int) -> str:
    """The router's disaggregation counters from /metrics, one line."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return ""
    return " ".join(
        line.removeprefix("interlock_disagg_")
        for line in text.splitlines()
        if line.startswith("interlock_disagg_")
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--rate", type=float, default=0.5)
    ap.add_argument("--long", type=int, default=2000)
    ap.add_argument("--short", type=int, default=100)
    ap.add_argument("--output", type=int, default=32)
    ap.add_argument("--modes", default="agg,cond,enforced")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    from interlock.model_store import resolve_model

    tokenizer = str(resolve_model("smollm2", progress=False))
    work = Path(tempfile.mkdtemp(prefix="disagg-e2e-"))
    trace = work / "trace.jsonl"
    write_trace(trace, args.requests, args.rate, args.long, args.short, args.output, args.seed)
    table = []
    counters: dict[str, str] = {}
    for mode in args.modes.split(","):
        port = free_port()
        deploy = work / f"{mode}.yaml"
        deploy.write_text(deployment(mode, port))
        proc = serve(deploy)
        try:
            results = work / f"{mode}.json"
            subprocess.run(
                [
                    PY,
                    "-m",
                    "interlock.cli.main",
                    "bench",
                    "--url",
                    f"http://127.0.0.1:{port}",
                    "--trace",
                    str(trace),
                    "--api",
                    "completions",
                    "--tokenizer",
                    tokenizer,
                    "--prompt-as",
                    "ids",
                    "--warmup",
                    "2",
                    "--out",
                    str(results),
                    "--no-plot",
                    "--no-progress",
                    "--seed",
                    str(args.seed),
                ],
                cwd=ROOT,
                check=True,
                env={**os.environ, "HF_HUB_OFFLINE": "1"},
                stdout=subprocess.DEVNULL,
            )
            table.append((mode, figures(results, args.long)))
            counters[mode] = disagg_counters(port)
        finally:
            stop(proc)
        print(f"{mode} done", flush=True)
    names = {"agg": "2 aggregated", "cond": "1P+1D conditional", "enforced": "1P+1D always remote"}
    print(
        f"\n{args.requests} requests at {args.rate}/s (Poisson), every 4th {args.long} tokens, others "
        f"{args.short}; {args.output} output tokens; ms"
    )
    print(
        f"{'setup':<22} {'class':<6} {'n':>3} {'err':>3} {'TTFT p50':>9} {'p99':>7} {'ITL p50':>8} {'p99':>7}"
    )
    for mode, figs in table:
        for cls, f in figs.items():
            print(
                f"{names.get(mode, mode):<22} {cls:<6} {f['n']:>3} {f['errors']:>3} {f['ttft_p50']:>9.0f} "
                f"{f['ttft_p99']:>7.0f} {f['itl_p50']:>8.1f} {f['itl_p99']:>7.1f}"
            )
    for mode, text in counters.items():
        if text:
            print(f"{names.get(mode, mode)}: {text}")


if __name__ == "__main__":
    main()
