from __future__ import annotations

import pytest

from interlock.errors import ConfigError
from interlock.planner import PlannerConfig, RoleBounds, load_profile, parse_planner_config
from interlock.planner.ramp import routing_weight
from tests.planner.conftest import mock_profile


def test_parse_section() -> None:
    cfg = parse_planner_config(
        {"policy": "reactive", "window-s": 30, "both": {"min": 2, "max": 5}, "queue_high": 3}
    )
    assert cfg.window_s == 30.0 and cfg.both == RoleBounds(2, 5) and cfg.queue_high == 3.0
    assert parse_planner_config({"shrink-window-s": 30}).remove_window_s() == 30.0
    assert parse_planner_config(None) == PlannerConfig()


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ({"windw_s": 3}, "planner.windw_s: unknown key"),
        ({"policy": "magic"}, "'magic' is not one of"),
        ({"window_s": "fast"}, "planner.window_s: expected a number"),
        ({"max_changes": 1.5}, "planner.max_changes: expected a number"),
        ({"both": {"min": 3, "max": 2}}, "0 <= min <= max"),
        ({"both": {"lo": 1}}, "planner.both: expected {min: N, max: M}"),
        ({"queue_low": 5, "queue_high": 2}, "queue_low must be below"),
        ({"policy": "sla"}, "needs planner.profile"),
        ({"slo_feedback": "yes"}, "planner.slo_feedback: expected true or false"),
        ({"both": {"min": 0, "max": 0}}, "no worker allowed"),
        ({"surge": 0.8}, "planner.surge must be above 1"),
        ({"step_share": 2}, "planner.step_share must be in"),
        ({"shrink_window_s": 120}, "planner needs 0 <= shrink_window_s <= window_s"),
        ([1, 2], "expected a mapping"),
    ],
)
def test_bad_sections_are_refused_by_name(raw: object, words: str) -> None:
    with pytest.raises(ConfigError, match=words.replace("{", r"\{").replace("}", r"\}")):
        parse_planner_config(raw)  # type: ignore[arg-type]


def test_profile_file_round_trip_and_errors(tmp_path) -> None:  # type: ignore[no-untyped-def]
    p = mock_profile()
    path = tmp_path / "p.json"
    p.save(path)
    q = load_profile(path)
    assert q.prefill == p.prefill and q.decode == p.decode and q.itl_s(8, 2000) == p.itl_s(8, 2000)
    with pytest.raises(ConfigError, match="No such file"):
        load_profile(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ConfigError, match="not JSON"):
        load_profile(tmp_path / "bad.json")
    (tmp_path / "old.json").write_text('{"version": 0}')
    with pytest.raises(ConfigError, match="expected version 1"):
        load_profile(tmp_path / "old.json")
    (tmp_path / "short.json").write_text('{"version": 1, "runner": "mock"}')
    with pytest.raises(ConfigError, match="missing or bad field"):
        load_profile(tmp_path / "short.json")


def test_routing_weight_ramps_linearly() -> None:
    assert routing_weight(0.0, 60.0, 0.1) == pytest.approx(0.1)
    assert routing_weight(30.0, 60.0, 0.1) == pytest.approx(0.55)
    assert routing_weight(61.0, 60.0, 0.1) == 1.0
    assert routing_weight(0.0, 0.0, 0.1) == 1.0
