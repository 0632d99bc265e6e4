"""Cost of one observation on the request path: Interlock's registry against prometheus_client
(the choice in interlock/metrics/registry.py; figures in docs/design.md).

    .venv/bin/python benchmarks/metrics_cost.py
"""

from __future__ import annotations

import platform
import timeit

import prometheus_client as pc

from interlock.metrics import Registry

N = 200_000


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


def main() -> None:
    ours = Registry()
    h = ours.histogram("interlock_time_to_first_token_seconds")
    c = ours.counter("interlock_completion_tokens_total")
    reg = pc.CollectorRegistry()
    ph = pc.Histogram("t_seconds", "t", ["model"], registry=reg, buckets=h.buckets)
    pcn = pc.Counter("c_tokens", "c", ["model"], registry=reg)
    child = ph.labels("m")
    labels = ("m",)
    cases = {
        "histogram observe, labelled": (
            lambda: h.observe(0.03, labels),
            lambda: ph.labels("m").observe(0.03),
        ),
        "histogram observe, child kept": (lambda: h.observe(0.03, labels), lambda: child.observe(0.03)),
        "counter inc, labelled": (lambda: c.inc(labels, 16), lambda: pcn.labels("m").inc(16)),
    }
    print(f"CPU: {_cpu()}; {N:,} observations each, best of 5")
    print("| observation | Interlock ns | prometheus_client ns | ratio |")
    print("|---|---:|---:|---:|")
    for name, (a, b) in cases.items():
        ta = min(timeit.repeat(a, number=N, repeat=5)) / N * 1e9
        tb = min(timeit.repeat(b, number=N, repeat=5)) / N * 1e9
        print(f"| {name} | {ta:.0f} | {tb:.0f} | {tb / ta:.1f}x |")


if __name__ == "__main__":
    main()
