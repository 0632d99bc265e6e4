"""Command-line flags that fill ``PlannerConfig`` (beside the config they fill): used by
``interlock replay`` and, through the cluster builder, ``interlock serve``.

``--planner-config FILE`` reads a YAML file's ``planner:`` section (a deployment file), or the
whole file when it has none; flags override it. ``serve -f FILE`` reads FILE's ``planner:``
section the same way (its presence turns the planner on; ``policy`` defaults to reactive).
Planner flags without a planner are refused, so none is silently ignored. ``--min-workers 0``
lets the fleet scale to zero (``serve --workers 0`` starts none; ``RoleBounds`` allows 0).
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from interlock.deploy import PLANNER_SECTION
from interlock.errors import ConfigError
from interlock.planner.config import PLANNER_POLICIES, PlannerConfig, RoleBounds, parse_planner_config

_FLAG_FIELDS = {
    "planner_window_s": "window_s",
    "planner_interval_s": "interval_s",
    "planner_max_changes": "max_changes",
    "ramp_s": "ramp_s",
    "profile": "profile",
}


def add_planner_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("planner (the fleet follows the traffic)")
    g.add_argument(
        "--planner",
        choices=PLANNER_POLICIES,
        default=None,
        help="let the planner add, remove and re-role workers with this policy",
    )
    g.add_argument(
        "--planner-config",
        metavar="YAML",
        default=None,
        help="planner settings: a deployment file's planner: section (flags override)",
    )
    g.add_argument(
        "--profile",
        metavar="JSON",
        default=None,
        help="capability profile from `interlock profile` (the sla policy needs one)",
    )
    g.add_argument(
        "--min-workers",
        type=int,
        default=None,
        help="aggregated workers, at least (0: none while idle, one started when requests come)",
    )
    g.add_argument("--max-workers", type=int, default=None, help="aggregated workers, at most")
    g.add_argument(
        "--planner-window-s",
        type=float,
        default=None,
        help="after a change, observe this long before the next one",
    )
    g.add_argument("--planner-interval-s", type=float, default=None, help="observation period")
    g.add_argument(
        "--planner-max-changes",
        type=int,
        default=None,
        help="changes allowed per cap window (planner.cap_window_s; 0, the default: max(6, the fleet's maximum))",
    )
    g.add_argument(
        "--ramp-s",
        type=float,
        default=None,
        help="a new worker's routing weight ramps up over this long (0: at once)",
    )


def planner_config_from_args(
    args: argparse.Namespace, *, deployment_file: str | None = None, **targets: float
) -> PlannerConfig | None:
    """The planner configuration the flags (and ``deployment_file``'s ``planner:`` section) ask
    for, None without either. ``targets``: fields set by the command's own flags (e.g.
    ``ttft_ms``, ``itl_ms``)."""
    given = [
        f"--{name.replace('_', '-')}"
        for name in (*_FLAG_FIELDS, "min_workers", "max_workers", "planner_config")
        if getattr(args, name) is not None
    ]
    file_section = _file_section(deployment_file) if deployment_file else None
    if args.planner is None and file_section is None:
        if given:
            raise ConfigError(f"{', '.join(given)} needs --planner")
        return None
    if file_section is not None and args.planner_config:
        raise ConfigError(
            f"--planner-config: {deployment_file} has a planner: section already "
            "(one place for the planner's settings)"
        )
    where = f"{deployment_file}: planner" if file_section is not None else args.planner_config or "planner"
    raw: dict[str, Any] = _read_section(args.planner_config) if args.planner_config else {}
    raw = {**raw, **(file_section or {}), **targets}
    if args.planner is not None:
        raw["policy"] = args.planner
    for flag, name in _FLAG_FIELDS.items():
        if getattr(args, flag) is not None:
            raw[name] = getattr(args, flag)
    cfg = parse_planner_config(raw, where=where)
    if args.min_workers is not None or args.max_workers is not None:
        lo = cfg.both.min if args.min_workers is None else args.min_workers
        hi = cfg.both.max if args.max_workers is None else args.max_workers
        cfg = replace(cfg, both=RoleBounds(lo, hi))
    return cfg


def _load(path: str) -> Any:
    try:
        return yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise ConfigError(f"planner config {path}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"planner config {path}: not YAML ({e})") from None


def _file_section(path: str) -> dict[str, Any] | None:
    """A deployment file's ``planner:`` section (None: it has none)."""
    raw = _load(path)
    if not isinstance(raw, dict) or raw.get(PLANNER_SECTION) is None:
        return None
    section = raw[PLANNER_SECTION]
    if not isinstance(section, dict):
        raise ConfigError(f"{path}: planner: expected a mapping")
    return section


def _read_section(path: str) -> dict[str, Any]:
    raw = _load(path)
    if isinstance(raw, dict) and "planner" in raw:
        raw = raw["planner"]
    if not isinstance(raw, dict):
        raise ConfigError(f"planner config {path}: expected a mapping")
    return raw
