"""One exposition from several processes' expositions of the same catalogue: the frontend
processes serving one port (``control-plane.frontend_workers``) scraped as one frontend.

A series (a name and its labels) present in several texts is summed when its family adds up
(counters, histograms, and the gauges of a process's own work: ``Spec.adds_up``); a gauge of the
fleet as one process sees it (workers, their KV) keeps the first text's value, which every
process shares. Families and series keep the first text's order; what only a later text has
follows at the end of its family. Pure: text in, text out.
"""

from __future__ import annotations

from collections.abc import Sequence

from interlock.metrics.catalog import CATALOG
from interlock.metrics.registry import sample_value


def head_of(line: str) -> tuple[str, str, str] | None:
    """A ``# HELP`` or ``# TYPE`` line as (HELP or TYPE, family, the rest: its help or type);
    None for any other comment."""
    parts = line.split(" ", 3)
    if len(parts) < 3 or parts[1] not in ("HELP", "TYPE"):
        return None
    return parts[1], parts[2], parts[3] if len(parts) > 3 else ""


def merge_processes(texts: Sequence[str]) -> str:
    """``texts`` (each one process's text exposition) as one."""
    if len(texts) == 1:
        return texts[0]
    heads: dict[str, list[str]] = {}
    """family -> its HELP and TYPE lines"""
    series: dict[str, dict[str, float]] = {}
    """family -> sample key (name and labels) -> value"""
    sums: dict[str, bool] = {}
    for text in texts:
        family, histogram = "", False
        for line in text.splitlines():
            if not line:
                continue
            if line.startswith("#"):
                head = head_of(line)
                if head is None:
                    continue
                kind, family, kind_of = head
                if family not in heads:
                    heads[family], series[family] = [], {}
                if not any(x.startswith(f"# {kind} ") for x in heads[family]):
                    heads[family].append(line)
                if kind == "TYPE":
                    histogram = kind_of == "histogram"
                    spec = CATALOG.get(family)
                    sums[family] = spec.adds_up if spec is not None else kind_of != "gauge"
                continue
            key, _, value = line.rpartition(" ")
            name = key.split("{", 1)[0]
            if name != family and not (histogram and name[len(family) :] in ("_bucket", "_sum", "_count")):
                family, histogram = name, False  # a sample without a head of its own
                if family not in heads:
                    heads[family], series[family] = [], {}
            try:
                number = float(value)
            except ValueError:
                continue
            have = series[family]
            if key not in have:
                have[key] = number
            elif sums.get(family, True):
                have[key] += number
    lines: list[str] = []
    for family, comments in heads.items():
        lines += comments
        lines += [f"{key} {sample_value(value)}" for key, value in series[family].items()]
    return "\n".join(lines) + "\n"
