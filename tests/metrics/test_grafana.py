"""deploy/grafana and deploy/prometheus: every query names only catalogued metrics, every board
has something to show, and the scrape configuration reads the endpoints that serve them."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from interlock.metrics.catalog import CATALOG

ROOT = Path(__file__).resolve().parents[2]
BOARDS = sorted((ROOT / "deploy" / "grafana").glob("*.json"))
NAME = re.compile(r"\b(?:interlock|process)_[a-z0-9_]+")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def metric_names(expr: str) -> set[str]:
    """The metrics ``expr`` names, a histogram's series (``_bucket``...) under its own name."""
    names = set()
    for name in NAME.findall(expr):
        for suffix in HISTOGRAM_SUFFIXES:
            base = name.removesuffix(suffix)
            if base != name and base in CATALOG and CATALOG[base].kind == "histogram":
                name = base
                break
        names.add(name)
    return names


def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside rows (collapsed rows hold theirs) included."""
    for p in items:
        yield p
        yield from panels(p.get("panels", []))


def expressions(board: dict[str, Any]) -> Iterator[str]:
    for p in panels(board["panels"]):
        for t in p.get("targets", []):
            yield t["expr"]
    for var in board.get("templating", {}).get("list", []):
        query = var.get("query")
        if var.get("type") == "query":
            yield query["query"] if isinstance(query, dict) else str(query)


def load(path: Path) -> dict[str, Any]:
    board = json.loads(path.read_text())
    assert isinstance(board, dict)
    return board


def test_there_are_the_four_boards() -> None:
    assert [p.name for p in BOARDS] == [
        "disagg-transfer.json",
        "overview.json",
        "planner.json",
        "router-cache.json",
    ]


@pytest.mark.parametrize("path", BOARDS, ids=[p.stem for p in BOARDS])
def test_every_query_names_only_catalogued_metrics(path: Path) -> None:
    board = load(path)
    named = {name for expr in expressions(board) for name in metric_names(expr)}
    assert named, f"{path.name} names no metric"
    assert sorted(named - CATALOG.keys()) == []


@pytest.mark.parametrize("path", BOARDS, ids=[p.stem for p in BOARDS])
def test_every_board_has_a_panel_with_a_query_and_a_datasource_variable(path: Path) -> None:
    board = load(path)
    with_targets = [p for p in panels(board["panels"]) if p.get("targets")]
    assert with_targets
    assert all(t["expr"].strip() for p in with_targets for t in p["targets"])
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert all(p["datasource"]["uid"] == "${datasource}" for p in with_targets)
    ids = [p["id"] for p in panels(board["panels"])]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("path", BOARDS, ids=[p.stem for p in BOARDS])
def test_selectors_filter_only_on_labels_the_metric_has(path: Path) -> None:
    selectors = re.compile(r"\b((?:interlock|process)_[a-z0-9_]+)\{([^}]*)\}")
    for expr in expressions(load(path)):
        for name, body in selectors.findall(expr):
            (metric,) = metric_names(name)
            labels = set(re.findall(r"([a-z_]+)\s*[=!]~?", body))
            assert labels <= set(CATALOG[metric].labels) | {"le"}, (metric, labels)


def test_board_uids_are_unique() -> None:
    uids = [load(p)["uid"] for p in BOARDS]
    assert all(uids) and len(uids) == len(set(uids))


def test_metric_names_strip_suffixes_of_histograms_only() -> None:
    expr = (
        "histogram_quantile(0.9, sum by (le) (rate(interlock_time_to_first_token_seconds_bucket[5m])))"
        " / interlock_requests_total + process_cpu_seconds_total + interlock_made_up_count"
    )
    assert metric_names(expr) == {
        "interlock_time_to_first_token_seconds",
        "interlock_requests_total",
        "process_cpu_seconds_total",
        "interlock_made_up_count",
    }


def test_prometheus_scrapes_the_frontend_its_fleet_and_the_planner() -> None:
    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert set(jobs) == {"interlock-frontend", "interlock-fleet", "interlock-planner"}
    assert all(j["metrics_path"] == "/metrics" for j in jobs.values())
    assert jobs["interlock-fleet"]["params"] == {"scope": ["fleet"]}
    assert "params" not in jobs["interlock-frontend"]
