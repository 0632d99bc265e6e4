"""Results files and PNG reports: written, read back, valid."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.image
import pytest

from interlock.bench.loadgen import RunResult
from interlock.bench.plots import PlotRun, report_png
from interlock.bench.results import load, save
from interlock.bench.stats import Targets, summarize

from .test_stats import RECORDS


def _png_ok(path: Path) -> None:
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    height, width, _ = matplotlib.image.imread(str(path)).shape
    assert height > 300 and width > 300


def test_results_round_trip(tmp_path: Path) -> None:
    runs = [
        RunResult(
            "c=1", {"mode": "concurrency", "concurrency": 1}, "2026-01-01T00:00:00+00:00", 2.0, list(RECORDS)
        )
    ]
    save(tmp_path / "r.json", {"url": "http://x", "model": "m"}, runs, Targets(ttft_ms=200))
    back = load(tmp_path / "r.json")
    assert back.targets == Targets(ttft_ms=200) and back.meta["url"] == "http://x"
    assert back.runs[0].records == RECORDS
    assert summarize(back.runs[0].records, 2.0) == summarize(RECORDS, 2.0)


def test_sweep_report_png(tmp_path: Path) -> None:
    runs = [
        PlotRun(f"rate={r}", "sweep", RunResult(f"rate={r}", {}, "", 2.0 / r, list(RECORDS)))
        for r in (1, 2, 4)
    ]
    report_png(tmp_path / "sweep.png", runs, "interlock bench: http://x (m), 2026-01-01")
    _png_ok(tmp_path / "sweep.png")


def test_results_file_is_strict_json_with_failed_runs(tmp_path: Path) -> None:
    failed = [r for r in RECORDS if not r.ok]
    save(tmp_path / "f.json", {}, [RunResult("x", {}, "", 1.0, failed)], Targets())
    doc = json.loads((tmp_path / "f.json").read_text(), parse_constant=lambda c: pytest.fail(f"non-JSON {c}"))
    assert doc["runs"][0]["summary"]["ttft_ms"]["p50"] is None
