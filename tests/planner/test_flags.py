"""The planner's flags and a deployment file's ``planner:`` section, through `interlock serve`'s
parser: the section turns the planner on, flags override it, unknown keys and stray flags are
refused by name, and commands that run no planner refuse the section."""

from __future__ import annotations

from pathlib import Path

import pytest

from interlock.cli import frontend
from interlock.cli.serve import build_parser, spec_from_args
from interlock.cli.serving import deployment_from_args
from interlock.errors import ConfigError

DEPLOYMENT = """
execution-group: {runner: mock, max_replicas: 3, nodes: [{gpu_count: 1}]}
planner: {window_s: 2, interval_s: 0.5, both: {min: 1, max: 6}}
"""


def serve_spec(*argv: str):  # type: ignore[no-untyped-def]
    return spec_from_args(build_parser().parse_args(list(argv)))


def test_the_files_planner_section_turns_the_planner_on_and_flags_override_it(tmp_path: Path) -> None:
    f = tmp_path / "d.yaml"
    f.write_text(DEPLOYMENT)
    s = serve_spec("-f", str(f))
    assert s.planner is not None and s.planner.policy == "reactive"
    assert (s.planner.window_s, s.planner.interval_s, s.planner.both.max) == (2.0, 0.5, 6)
    assert s.planner_port == 8010
    s = serve_spec("-f", str(f), "--planner-window-s", "5", "--max-workers", "4", "--planner-port", "0")
    assert s.planner is not None and (s.planner.window_s, s.planner.both.max, s.planner_port) == (5.0, 4, 0)


def test_no_planner_without_the_flag_or_the_section() -> None:
    assert serve_spec("--runner", "mock").planner is None


@pytest.mark.parametrize(
    ("text", "argv", "message"),
    [
        ("planner: {windw_s: 2}\n", (), r"d.yaml: planner.windw_s: unknown key"),
        ("planner: [1]\n", (), "planner: expected a mapping"),
        ("planner: {}\n", ("--planner-config", "x.yaml"), "has a planner: section already"),
    ],
)
def test_bad_planner_sections_are_refused_by_name(
    tmp_path: Path, text: str, argv: tuple[str, ...], message: str
) -> None:
    f = tmp_path / "d.yaml"
    f.write_text("execution-group: {runner: mock}\n" + text)
    with pytest.raises(ConfigError, match=message):
        serve_spec("-f", str(f), *argv)


def test_a_command_that_runs_no_planner_refuses_the_section(tmp_path: Path) -> None:
    f = tmp_path / "d.yaml"
    f.write_text(DEPLOYMENT)
    a = frontend.build_parser().parse_args(["-f", str(f), "--nats-url", "nats://127.0.0.1:1"])
    with pytest.raises(ConfigError, match="planner: only `interlock serve` runs a planner"):
        deployment_from_args(a)


def test_a_planner_key_that_would_do_nothing_is_refused() -> None:
    """``drain_timeout_s`` was once accepted and acted nowhere (a drain's time is the worker's
    ``drain_grace``): unknown keys are refused by name."""
    from interlock.errors import ConfigError
    from interlock.planner import parse_planner_config

    with pytest.raises(ConfigError, match="drain_timeout_s"):
        parse_planner_config({"policy": "reactive", "drain_timeout_s": 30})


def test_min_workers_zero_lets_serve_start_no_worker() -> None:
    s = serve_spec("--runner", "mock", "--workers", "0", "--planner", "reactive", "--min-workers", "0")
    assert s.deployment.num_workers == 0
    assert s.planner is not None and (s.planner.both.min, s.planner.both.max) == (0, 8)
    for argv in (("--workers", "0"), ("--workers", "0", "--planner", "reactive")):
        with pytest.raises(ConfigError, match=r"starts no worker .*--planner reactive --min-workers 0"):
            serve_spec("--runner", "mock", *argv)
    with pytest.raises(ConfigError, match="--workers must be at least 0"):
        serve_spec("--workers", "-1")
