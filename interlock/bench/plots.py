"""PNG reports (matplotlib, Agg backend: no display needed).

Panels, one line per run: TTFT CDF, per-request ITL CDF, output throughput over time, and
end-to-end latency CDF. When a group of runs is a sweep (more than one run from one file or
invocation), a third row plots latency against output throughput: one line per sweep, one
point per run, p50 and p90 TTFT on the left and p50 ITL on the right. The title names the
endpoint(s) and the date(s).
"""

from __future__ import annotations

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


def _distribution_panels(axes: Sequence[Axes], runs: Sequence[PlotRun]) -> None:
    ttft_ax, itl_ax, tput_ax, e2e_ax = axes
    for pr in runs:
        ok = [r for r in pr.run.records if r.ok]
        _cdf(ttft_ax, [r.ttft_s * 1000 for r in ok if r.ttft_s is not None], pr.label)
        _cdf(itl_ax, [v * 1000 for r in ok if (v := request_itl_s(r)) is not None], pr.label)
        _cdf(e2e_ax, [r.e2e_s * 1000 for r in ok if r.e2e_s is not None], pr.label)
        xs, ys = throughput_series(pr.run.records, pr.run.duration_s)
        tput_ax.plot(xs, ys, label=pr.label)
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
    for ax, name in ((ttft_ax, "TTFT"), (itl_ax, "ITL")):
        ax.set_xlabel("output throughput (tokens/s)")
        ax.set_ylabel(f"{name} (ms)")
        ax.set_title(f"{name} versus throughput")


def report_png(path: str | Path, runs: Sequence[PlotRun], title: str) -> None:
    has_sweep = any(sum(p.group == g.group for p in runs) > 1 for g in runs)
    nrows = 3 if has_sweep else 2
    fig, axes = plt.subplots(nrows, 2, figsize=(13, 4.2 * nrows), squeeze=False)
    _distribution_panels([axes[0][0], axes[0][1], axes[1][0], axes[1][1]], runs)
    if has_sweep:
        _sweep_panels(axes[2][0], axes[2][1], runs)
    for ax in axes.flat:
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    fig.suptitle(title, fontsize=12)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
