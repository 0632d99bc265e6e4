"""The planner's virtual-time connector on a stepped load (low, high, low)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from interlock.errors import ConfigError
from interlock.planner import AddWorker, PlannerConfig, RemoveWorker, RoleBounds
from interlock.router import RouterConfig
from interlock.sim import ReplayConfig, SharedPrefixSpec, replay, shared_prefix_requests
from interlock.sim.rate import parse_curve, warp

PLANNER = PlannerConfig(both=RoleBounds(1, 6), window_s=20.0, interval_s=2.0, ramp_s=10.0)
BASE = ReplayConfig(num_workers=1, num_blocks=4000, block_size=16, max_num_batched_tokens=512,
                    engine_speedup=0.1, router=RouterConfig(block_size=16, seed=0),
                    startup_s=5.0, ttft_slo_ms=2000, itl_slo_ms=200)


def stepped() -> list:  # type: ignore[type-arg]
    spec = SharedPrefixSpec(num_requests=900, num_groups=8, system_tokens=512, suffix_tokens=256,
                            output_tokens=40, rate=1.0, block_size=16)
    return warp(shared_prefix_requests(spec), parse_curve("steps:120x1,120x4,120x1"))


@pytest.fixture(scope="module")
def planned():  # type: ignore[no-untyped-def]
    return replay(stepped(), replace(BASE, planner=PLANNER))


def test_workers_added_one_per_window_then_removed(planned) -> None:  # type: ignore[no-untyped-def]
    kinds = [type(r.action) for r in planned.planner_decisions]
    assert AddWorker in kinds and RemoveWorker in kinds
    first_remove = kinds.index(RemoveWorker)
    assert set(kinds[:first_remove]) == {AddWorker}  # grow while high, then shrink
    times = [r.at for r in planned.planner_decisions]
    assert all(b - a >= PLANNER.window_s for a, b in zip(times, times[1:], strict=False))
    assert planned.num_completed == planned.num_requests and planned.num_rejected == 0


def test_planner_beats_a_fixed_fleet_for_the_peak_on_worker_seconds(planned) -> None:  # type: ignore[no-untyped-def]
    peak = 1 + sum(1 for r in planned.planner_decisions if isinstance(r.action, AddWorker))
    fixed = replay(stepped(), replace(BASE, num_workers=peak))
    small = replay(stepped(), BASE)
    assert planned.worker_seconds < 0.5 * fixed.worker_seconds
    assert planned.sla_attainment > small.sla_attainment + 0.3


def test_round_robin_with_a_ramp_is_refused() -> None:
    cfg = replace(BASE, planner=PLANNER, router=RouterConfig(policy="round-robin", block_size=16))
    with pytest.raises(ConfigError, match="no routing weights"):
        replay(stepped()[:10], cfg)
