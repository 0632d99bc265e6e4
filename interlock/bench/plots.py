"""PNG reports (matplotlib, Agg backend: no display needed).

Panels, one line per run: TTFT CDF, per-request ITL CDF, output throughput over time, and
end-to-end latency CDF; then errors by kind over time (cumulative, by send time) and the
server's own figures beside the client's (mean TTFT as the client saw it against the server's
queue and prefill time; cache hit rate, migrations and preemptions). When a group of runs is a
sweep (more than one run from one file or invocation), a last row plots latency against output
throughput: one line per sweep, one point per run, p50 and p90 TTFT on the left and p50 ITL on
the right. A latency axis is logarithmic where its values spread wide (largest over smallest
above ``LOG_SPREAD``). The title names the endpoint(s) and the date(s).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402

from interlock.bench.loadgen import RunResult  # noqa: E402
from interlock.bench.stats import request_itl_s, summarize, throughput_series  # noqa: E402
from interlock.bench.table import server_rows  # noqa: E402

LOG_SPREAD = 20.0


@dataclass(frozen=True)
class PlotRun:
    label: str
    group: str
    """Runs sharing a group (a sweep) form one latency-versus-throughput line."""
    run: RunResult


def _cdf(ax: Axes, values_ms: Sequence[float], label: str) -> None:
    if not values_ms:
        return
    xs = np.sort(np.asarray(values_ms))
    ax.plot(xs, np.arange(1, len(xs) + 1) / len(xs), label=label, drawstyle="steps-post")


def wide_spread(values: Sequence[float]) -> bool:
    """Whether a latency axis over ``values`` reads better logarithmic."""
    positive = [v for v in values if v > 0 and math.isfinite(v)]
    return len(positive) > 1 and max(positive) / min(positive) > LOG_SPREAD


def _distribution_panels(axes: Sequence[Axes], runs: Sequence[PlotRun]) -> None:
    ttft_ax, itl_ax, tput_ax, e2e_ax = axes
    seen: dict[Axes, list[float]] = {ttft_ax: [], itl_ax: [], e2e_ax: []}
    for pr in runs:
        ok = [r for r in pr.run.records if r.ok]
        for ax, values in (
            (ttft_ax, [r.ttft_s * 1000 for r in ok if r.ttft_s is not None]),
            (itl_ax, [v * 1000 for r in ok if (v := request_itl_s(r)) is not None]),
            (e2e_ax, [r.e2e_s * 1000 for r in ok if r.e2e_s is not None]),
        ):
            _cdf(ax, values, pr.label)
            seen[ax] += values
        xs, ys = throughput_series(pr.run.records, pr.run.duration_s)
        tput_ax.plot(xs, ys, label=pr.label)
    for ax, values in seen.items():
        if wide_spread(values):
            ax.set_xscale("log")
    for ax, name in ((ttft_ax, "TTFT"), (itl_ax, "ITL per request"), (e2e_ax, "end-to-end latency")):
        ax.set_xlabel(f"{name} (ms)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"{name} (CDF)")
    tput_ax.set_xlabel("time since start (s)")
    tput_ax.set_ylabel("output throughput (tokens/s)")
    tput_ax.set_title("output throughput over time")


def _sweep_panels(ttft_ax: Axes, itl_ax: Axes, runs: Sequence[PlotRun]) -> None:
    groups: dict[str, list[PlotRun]] = {}
    for pr in runs:
        groups.setdefault(pr.group, []).append(pr)
    for group, members in groups.items():
        sums = sorted(
            (summarize(m.run.records, m.run.duration_s) for m in members), key=lambda s: s.output_throughput
        )
        xs = [s.output_throughput for s in sums]
        (line,) = ttft_ax.plot(xs, [s.ttft_ms.p50 for s in sums], marker="o", label=f"{group} p50")
        ttft_ax.plot(
            xs,
            [s.ttft_ms.p90 for s in sums],
            marker="^",
            linestyle="--",
            color=line.get_color(),
            label=f"{group} p90",
        )
        itl_ax.plot(xs, [s.itl_ms.p50 for s in sums], marker="o", label=f"{group} p50")
    for ax in (ttft_ax, itl_ax):
        if wide_spread([y for line in ax.get_lines() for y in np.asarray(line.get_ydata(), dtype=float)]):
            ax.set_yscale("log")
    for ax, name in ((ttft_ax, "TTFT"), (itl_ax, "ITL")):
        ax.set_xlabel("output throughput (tokens/s)")
        ax.set_ylabel(f"{name} (ms)")
        ax.set_title(f"{name} versus throughput")


def _errors_panel(ax: Axes, runs: Sequence[PlotRun]) -> None:
    for pr in runs:
        kinds = sorted({r.error for r in pr.run.records if r.error is not None})
        for kind in kinds:
            times = sorted(r.start_s for r in pr.run.records if r.error == kind)
            ax.step([0.0, *times], range(len(times) + 1), where="post", label=f"{pr.label} {kind}")
    if not ax.get_lines():
        ax.text(0.5, 0.5, "no errors", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("send time since start (s)")
    ax.set_ylabel("failed requests (cumulative)")
    ax.set_title("errors by kind")


def _server_panel(ax: Axes, runs: Sequence[PlotRun]) -> None:
    """Where the client's TTFT went, as the server counted it, and the server's other figures."""
    width = 0.27
    for i, pr in enumerate(runs):
        ttft = summarize(pr.run.records, pr.run.duration_s).ttft_ms.mean
        f = pr.run.server
        bars = (
            ("client TTFT", ttft),
            (
                "server queue",
                None if f is None or f.queue_time_mean_s is None else f.queue_time_mean_s * 1000,
            ),
            (
                "server prefill",
                None if f is None or f.prefill_time_mean_s is None else f.prefill_time_mean_s * 1000,
            ),
        )
        for k, (name, value) in enumerate(bars):
            if value is not None and math.isfinite(value):
                ax.bar(i + (k - 1) * width, value, width, color=f"C{k}", label=name if i == 0 else None)
    ax.set_xticks(range(len(runs)), [pr.label for pr in runs], fontsize="small")
    ax.set_xlim(-0.5, len(runs) - 0.5)
    ax.set_ylim(top=ax.get_ylim()[1] * 1.3)  # room for the notes above the bars
    ax.set_ylabel("mean (ms)")
    ax.set_title("client and server time per request")
    notes = []
    for pr in runs:
        rows = dict(server_rows(pr.run.server))
        if "server /metrics" in rows:
            notes.append(f"{pr.label}: server /metrics not available")
        else:
            notes.append(
                f"{pr.label}: cache hit {rows['server cache hit rate']}, "
                f"migrations {rows['server migrations']}, preemptions {rows['server preemptions']}"
            )
    ax.text(0.01, 0.98, "\n".join(notes), transform=ax.transAxes, va="top", fontsize="x-small")


def report_png(path: str | Path, runs: Sequence[PlotRun], title: str) -> None:
    has_sweep = any(sum(p.group == g.group for p in runs) > 1 for g in runs)
    nrows = 4 if has_sweep else 3
    fig, axes = plt.subplots(nrows, 2, figsize=(13, 4.2 * nrows), squeeze=False)
    _distribution_panels([axes[0][0], axes[0][1], axes[1][0], axes[1][1]], runs)
    _errors_panel(axes[2][0], runs)
    _server_panel(axes[2][1], runs)
    if has_sweep:
        _sweep_panels(axes[3][0], axes[3][1], runs)
    for ax in axes.flat:
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    fig.suptitle(title, fontsize=12)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
