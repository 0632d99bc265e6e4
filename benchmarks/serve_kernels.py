"""What the fused CPU kernels change for a user: `interlock serve` with them and without.

    .venv/bin/python benchmarks/serve_kernels.py [--requests 24] [--concurrency 1,8]

Starts ``interlock serve --workers 1`` twice on this machine with the real SmolLM2, once as
shipped and once with ``INTERLOCK_CPU_KERNELS=0`` (the plain PyTorch path), and runs the same
``interlock bench`` load against each: closed-loop concurrency sweep, 512-token prompts sent as
token ids over the completions API, 64 output tokens, ``ignore_eos``. Reports TTFT and ITL
(per-request mean gap) p50/p99 and output tokens/s per concurrency.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from disagg_e2e import PY, ROOT, free_port, stop  # noqa: E402  (a sibling script, not a package)


def serve(port: int, kernels: bool) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
        "INTERLOCK_LOG_LEVEL": "WARNING",
        "INTERLOCK_CPU_KERNELS": "1" if kernels else "0",
    }
    proc = subprocess.Popen(
        [PY, "-m", "interlock.cli.main", "serve", "--workers", "1", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if "Interlock serving" in line:
            return proc
    proc.kill()
    raise RuntimeError("interlock serve did not become ready")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=24, help="per concurrency level")
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--paths", default="fused,plain", help="which engine paths to serve")
    args = ap.parse_args()
    from interlock.model_store import resolve_model

    tokenizer = str(resolve_model("smollm2", progress=False))
    work = Path(tempfile.mkdtemp(prefix="serve-kernels-"))
    rows = []
    for kernels in (path == "fused" for path in args.paths.split(",")):
        port = free_port()
        proc = serve(port, kernels)
        try:
            # One bench run per level, each with its own prompts: a sweep in one run would send
            # the same prompts again and measure prefix-cache hits instead of prefills.
            for level, conc in enumerate(args.concurrency.split(",")):
                out = work / f"kernels-{int(kernels)}-c{conc}.json"
                subprocess.run(
                    [
                        PY,
                        "-m",
                        "interlock.cli.main",
                        "bench",
                        "--url",
                        f"http://127.0.0.1:{port}",
                        "--concurrency",
                        conc,
                        "--num-requests",
                        str(args.requests),
                        "--input-len",
                        str(args.input_len),
                        "--output-len",
                        str(args.output_len),
                        "--api",
                        "completions",
                        "--tokenizer",
                        tokenizer,
                        "--prompt-as",
                        "ids",
                        "--seed",
                        str(100 + level),
                        "--warmup",
                        "2",
                        "--out",
                        str(out),
                        "--no-plot",
                        "--no-progress",
                    ],
                    cwd=ROOT,
                    check=True,
                    env={**os.environ, "HF_HUB_OFFLINE": "1"},
                    stdout=subprocess.DEVNULL,
                )
                for run in json.loads(out.read_text())["runs"]:
                    s = run["summary"]
                    rows.append(
                        (
                            "fused kernels" if kernels else "plain PyTorch",
                            run["load"]["concurrency"],
                            s["ok"],
                            s["requests"],
                            s["ttft_ms"],
                            s["itl_ms"],
                            s["output_throughput"],
                            s.get("cached_fraction") or 0.0,
                        )
                    )
        finally:
            stop(proc)
    print(
        f"\n1 worker, {args.input_len}-token prompts, {args.output_len} output tokens, "
        f"{args.requests} requests per level; ms"
    )
    print(
        "| engine path | concurrency | ok | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 | output tok/s | cached |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, conc, ok, total, ttft, itl, tput, cached in rows:
        print(
            f"| {name} | {conc} | {ok}/{total} | {ttft['p50']:.0f} | {ttft['p99']:.0f} | {itl['p50']:.1f} "
            f"| {itl['p99']:.1f} | {tput:.1f} | {cached:.0%} |"
        )


if __name__ == "__main__":
    main()
