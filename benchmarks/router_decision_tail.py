"""Where the routing decision's p99 comes from (issue 10 item 7): the same index and load as
``router_decision.py``, then

- the decision's CPU time by kind of request (cached history, shared system prompt, prompt
  nobody holds: ``router_decision.Fleet.request`` cycles through them);
- the same decision again and again (one prompt, routed and finished N times in a row): the
  spread of identical work on this machine;
- a fixed pure-Python loop timed the same way, for the clock and the machine alone.

    PYTHONPATH=. .venv/bin/python benchmarks/router_decision_tail.py --workers 1024
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import numpy as np

from interlock.router import Pending, RequestMeta

sys.path.insert(0, str(Path(__file__).resolve().parent))
import router_decision as rd  # noqa: E402


def pct(xs: list[float]) -> str:
    a = np.array(xs)
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return f"p50 {p50:.1f} / p90 {p90:.1f} / p99 {p99:.1f} µs (n={len(a)})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=1024)
    ap.add_argument("--blocks", type=int, default=1_000_000)
    ap.add_argument("--decisions", type=int, default=3000)
    args = ap.parse_args()
    r, fleet, rng, requests, now, *_ = rd.prepare(args.workers, args.blocks, args.decisions)
    by_kind: dict[int, list[float]] = {0: [], 1: [], 2: []}
    for i, _, d, cpu_ns in rd.drive(r, fleet, rng, requests, now):
        if not isinstance(d, Pending):
            by_kind[i % 3].append(cpu_ns / 1e3)
    for kind, name in enumerate(("cached history", "shared system prompt", "prompt nobody holds")):
        print(f"{name:>22}: {pct(by_kind[kind])}")
    hashes, prompt, max_tokens = requests[2]
    same: list[float] = []
    for j in range(args.decisions):
        meta = RequestMeta(request_id=f"same{j}", prompt_tokens=prompt, max_tokens=max_tokens)
        c0 = time.thread_time_ns()
        d = r.route(meta, block_hashes=hashes)
        c1 = time.thread_time_ns()
        same.append((c1 - c0) / 1e3)
        if isinstance(d, Pending):
            r.cancel(meta.request_id)
        else:
            r.on_first_token(d.request_id)
            r.on_finish(d.request_id)
    print(f"{'the same decision':>22}: {pct(same)} ({len(hashes)} blocks, nobody holds them)")
    loop: list[float] = []
    for _ in range(args.decisions):
        c0 = time.thread_time_ns()
        sum(range(600))
        c1 = time.thread_time_ns()
        loop.append((c1 - c0) / 1e3)
    print(f"{'fixed Python loop':>22}: {pct(loop)}")
    gc.unfreeze()


if __name__ == "__main__":
    main()
