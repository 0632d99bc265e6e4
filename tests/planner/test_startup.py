"""Start-up times: seeded by a profile, replaced by the first measurement, then smoothed."""

from __future__ import annotations

import pytest

from interlock.planner.startup import StartupKey, StartupTimes

TORCH = StartupKey("interlock/torch", "smollm2")
MOCK = StartupKey("interlock/mock", "smollm2")


def test_unknown_is_zero_and_keys_are_apart() -> None:
    t = StartupTimes()
    assert t.estimate(TORCH) == 0.0
    t.record(TORCH, 10.0)
    assert t.estimate(TORCH) == 10.0 and t.estimate(MOCK) == 0.0


def test_a_seed_holds_until_the_first_measurement_replaces_it() -> None:
    t = StartupTimes(alpha=0.5)
    t.seed(TORCH, 30.0)
    assert t.estimate(TORCH) == 30.0
    t.record(TORCH, 10.0)
    assert t.estimate(TORCH) == 10.0  # measured beats profiled
    t.seed(TORCH, 99.0)  # a later seed does not override a measurement
    assert t.estimate(TORCH) == 10.0


def test_measurements_are_smoothed() -> None:
    t = StartupTimes(alpha=0.5)
    for s in (10.0, 20.0, 20.0):
        t.record(TORCH, s)
    assert t.estimate(TORCH) == pytest.approx(17.5)


def test_bad_values_are_refused() -> None:
    with pytest.raises(ValueError):
        StartupTimes(alpha=0.0)
    with pytest.raises(ValueError):
        StartupTimes().record(TORCH, -1.0)


def test_offloaded_weights_count_as_start_up() -> None:
    """A worker whose weights are out serves its next request only after they load: the
    policies' start-up horizon grows by the longest such return (draining workers aside)."""
    from interlock.planner.state import Observation, WorkerView
    from tests.factories import load_report

    warm = WorkerView.of("a", "both", load_report("a"))
    out = WorkerView.of("b", "both", load_report("b", weights_load_s=4.0))
    leaving = WorkerView.of("c", "both", load_report("c", weights_load_s=9.0), draining=True)
    assert out.weights_out_s == 4.0 and warm.weights_out_s == 0.0
    assert Observation.with_returns(10.0, [warm]) == 10.0
    assert Observation.with_returns(10.0, [warm, out, leaving]) == 14.0
    assert Observation.with_returns(0.0, []) == 0.0
