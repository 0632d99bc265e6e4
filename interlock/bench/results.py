"""Results files: one JSON document per ``interlock bench`` invocation.

Layout (``format: interlock-bench/1``)::

    {"format": ..., "meta": {"url", "model", "api", "date", "command", "tokenizer", "targets"},
     "runs": [{"label", "load", "started_at", "duration_s", "summary", "requests": [...],
               "server": {...} or null}]}

``requests`` holds every request's record (times in seconds, relative to the run start or to
the request's own send time, see ``client.RequestRecord``); ``server`` what the server's own
``/metrics`` counted during the run (``server_metrics.ServerFigures``; null where it has
none). ``summary`` is derived data kept for readers; tools that load a file recompute it from
``requests``, the single source.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from interlock.bench.client import RequestRecord
from interlock.bench.loadgen import RunResult
from interlock.bench.server_metrics import ServerFigures
from interlock.bench.stats import Targets, summarize
from interlock.errors import ConfigError

FORMAT = "interlock-bench/1"
_RECORD_FIELDS = {f.name for f in fields(RequestRecord)}


@dataclass
class BenchFile:
    meta: dict[str, Any]
    runs: list[RunResult]
    path: str = ""

    @property
    def targets(self) -> Targets:
        return Targets(**(self.meta.get("targets") or {}))


def _record_json(r: RequestRecord) -> dict[str, Any]:
    d = asdict(r)
    d["chunk_times_s"] = [round(t, 6) for t in r.chunk_times_s]
    return d


def _finite(value: Any) -> Any:
    """NaN (an empty distribution) becomes null: the file stays strict JSON for other tools."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value


def save(path: str | Path, meta: dict[str, Any], runs: list[RunResult], targets: Targets) -> None:
    doc = {
        "format": FORMAT,
        "meta": {**meta, "targets": asdict(targets)},
        "runs": [
            {
                "label": run.label,
                "load": run.load,
                "started_at": run.started_at,
                "duration_s": run.duration_s,
                "summary": _finite(summarize(run.records, run.duration_s, targets).to_json()),
                "requests": [_record_json(r) for r in run.records],
                "server": None if run.server is None else _finite(run.server.to_json()),
            }
            for run in runs
        ],
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(doc, allow_nan=False))


def load(path: str | Path) -> BenchFile:
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read results file {path}: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ConfigError(f"{path} is not an interlock bench results file ({FORMAT})")
    runs = [
        RunResult(
            label=run["label"],
            load=run["load"],
            started_at=run["started_at"],
            duration_s=run["duration_s"],
            records=[
                RequestRecord(**{k: v for k, v in r.items() if k in _RECORD_FIELDS}) for r in run["requests"]
            ],
            server=ServerFigures.from_json(run["server"]) if run.get("server") else None,
        )
        for run in doc["runs"]
    ]
    return BenchFile(doc["meta"], runs, str(path))
