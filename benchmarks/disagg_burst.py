"""A burst against enforced disaggregation: do requests wait for a busy prefill pool, or get 503?

    .venv/bin/python benchmarks/disagg_burst.py [--concurrency 32] [--requests 300] [--speedup 4]

Starts ``interlock serve -f <file>`` with mock runners (no model compute: the step times are
modelled, divided by ``--speedup``): 1 prefill worker that counts as busy past
``--queue-depth`` waiting requests, 1 decode worker (busy past ``--decode-queue-depth``),
``routing.enforce-disagg``. Then
``interlock bench --concurrency`` sends the burst over HTTP (completions API) and the script
prints what came back (ok, 503s), TTFT, the prompt tokens the responses' usage reports as
cached, and the router's counters (queued by role, rejected, prefill placement reasons).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from disagg_e2e import PY, ROOT, free_port, pct, serve, stop  # noqa: E402

DEPLOY = """control-plane: {{listen-port: {port}}}
routing: {{enforce-disagg: true}}
execution-group:
  model: smollm2
  runner: mock
  speedup: {speedup}
  block-size: 16
  nodes:
    - {{node-role: prefill, count: 1, max-num-batched-tokens: 256, queue-depth-threshold: {depth}, num-blocks: 4096}}
    - {{node-role: decode, count: 1, max-num-batched-tokens: 256, queue-depth-threshold: {decode_depth}, num-blocks: 4096}}
"""

COUNTERS = ("interlock_router_queued_total", "interlock_router_rejected_total", "interlock_disagg_")


def counters(port: int) -> list[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return [line for line in text.splitlines() if line.startswith(COUNTERS)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--speedup", type=float, default=4.0)
    ap.add_argument("--queue-depth", type=int, default=2, help="the prefill worker's busy mark")
    ap.add_argument("--decode-queue-depth", type=int, default=32, help="the decode worker's")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="disagg-burst-"))
    port = free_port()
    deploy = work / "enforce.yaml"
    deploy.write_text(
        DEPLOY.format(
            port=port, speedup=args.speedup, depth=args.queue_depth, decode_depth=args.decode_queue_depth
        )
    )
    results = work / "bench.json"
    proc = serve(deploy)
    try:
        subprocess.run(
            [PY, "-m", "interlock.cli.main", "bench", "--url", f"http://127.0.0.1:{port}"]
            + ["--api", "completions", "--concurrency", str(args.concurrency)]
            + ["--num-requests", str(args.requests), "--input-len", str(args.input_len)]
            + ["--output-len", str(args.output_len), "--out", str(results), "--no-plot", "--no-progress"],
            cwd=ROOT,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        lines = counters(port)
        report = json.loads(results.read_text())
    finally:
        stop(proc)
        shutil.rmtree(work, ignore_errors=True)
    recs = [r for run in report["runs"] for r in run["requests"]]
    ok = [r for r in recs if r["error"] is None and r["ttft_s"] is not None]
    errors: dict[str, int] = {}
    for r in recs:
        if r["error"] is not None:
            key = str(r["error"])[:60]
            errors[key] = errors.get(key, 0) + 1
    ttft = [r["ttft_s"] * 1e3 for r in ok]
    prompt = sum(r["prompt_tokens_usage"] or 0 for r in ok)
    cached = sum(r["cached_tokens_usage"] or 0 for r in ok)
    print(
        f"{len(recs)} requests at concurrency {args.concurrency}: {len(ok)} ok, errors {errors or 'none'}; "
        f"TTFT p50 {pct(ttft, 50):.0f} ms, p99 {pct(ttft, 99):.0f} ms; "
        f"usage: {cached} of {prompt} prompt tokens cached"
    )
    for line in lines:
        print(line)


if __name__ == "__main__":
    main()
