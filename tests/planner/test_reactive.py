"""The reactive policy's inter-token-time signal: grow the pool that decodes when its tokens
come slower than the ITL target, keep it while they are inside the band, shrink below it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from interlock.errors import ConfigError
from interlock.planner import (
    AddWorker,
    Observation,
    PlannerConfig,
    RemoveWorker,
    RoleBounds,
    SwitchRole,
    Traffic,
    WorkerView,
    build_planner,
)

CFG = PlannerConfig(
    both=RoleBounds(1, 4),
    window_s=60.0,
    grow_window_s=60.0,
    shrink_window_s=60.0,
    max_changes=100,
    itl_ms=200.0,
    itl_low=0.5,
)


def busy(n: int, step_s: float, role: str = "both", running: int = 8) -> tuple[WorkerView, ...]:
    """``n`` workers with no queue, little KV, decoding at ``step_s`` per token."""
    return tuple(
        WorkerView(f"{role[0]}{i}", role, num_running=running, kv_usage=0.1, decode_step_s=step_s)
        for i in range(n)
    )


def decoded(step_s: float, tokens: int = 100) -> Traffic:
    return Traffic(duration_s=5.0, decode_tokens=tokens, decode_s=tokens * step_s)


def run(
    cfg: PlannerConfig, workers: list[WorkerView], itl_of_n, until: float = 600.0
) -> list[tuple[float, str]]:  # type: ignore[no-untyped-def]
    """Ticks every 5 s; the fleet's observed ITL is ``itl_of_n(size)``; actions applied at once."""
    p = build_planner(cfg)
    log: list[tuple[float, str]] = []
    t = 0.0
    while t <= until:
        step = itl_of_n(len(workers))
        ws = tuple(replace(w, decode_step_s=step, num_running=4) for w in workers)
        for a in p.decide(Observation(t, ws, traffic=decoded(step))):
            if isinstance(a, AddWorker):
                workers.append(WorkerView(f"n{len(log)}", a.role))
                log.append((t, "add"))
            elif isinstance(a, RemoveWorker):
                workers = [w for w in workers if w.worker_id != a.worker_id]
                log.append((t, "remove"))
        t += 5.0
    return log


def test_decode_step_over_the_itl_target_grows_the_pool() -> None:
    [a] = build_planner(CFG).decide(Observation(0.0, busy(2, 0.25)))
    assert isinstance(a, AddWorker) and "inter-token time 250ms > 200ms" in a.reason


def test_observed_itl_counts_when_the_decode_step_looks_fine() -> None:
    """Prefill chunks sharing the steps make tokens slower than a pure decode step."""
    [a] = build_planner(CFG).decide(Observation(0.0, busy(2, 0.15), traffic=decoded(0.3)))
    assert isinstance(a, AddWorker) and "inter-token time 300ms" in a.reason
    assert build_planner(CFG).decide(Observation(0.0, busy(2, 0.15), traffic=decoded(0.18))) == []


def test_no_itl_growth_while_a_worker_of_the_pool_is_idle() -> None:
    """Slow tokens with a worker doing nothing is the router's to fix: another worker would
    idle too."""
    ws = (*busy(1, 0.3), WorkerView("idle", "both", kv_usage=0.0))
    assert build_planner(CFG).decide(Observation(0.0, ws)) == []


def test_idle_workers_give_no_decode_step() -> None:
    """A stale decode step of a worker with nothing running is no signal."""
    ws = tuple(WorkerView(f"w{i}", "both", decode_step_s=0.5, kv_usage=0.0) for i in range(2))
    p = build_planner(CFG)
    acts = [a for t in range(0, 100, 5) for a in p.decide(Observation(float(t), ws))]
    assert [type(a) for a in acts] == [RemoveWorker]


def test_no_shrink_while_itl_is_inside_the_band() -> None:
    # 120 ms: under the 200 ms target, over 0.5 x 200: the pool keeps its size
    assert run(CFG, list(busy(3, 0.12)), lambda n: 0.12) == []
    # 90 ms: a removal after a whole window, then another
    assert run(CFG, list(busy(3, 0.09)), lambda n: 0.09) == [(55.0, "remove"), (120.0, "remove")]


def test_no_flapping_on_an_itl_hovering_at_the_target() -> None:
    log = run(CFG, list(busy(2, 0.2)), lambda n: 0.2 * 2 / n + (0.01 if int(n) % 2 else -0.01), until=1200.0)
    assert {k for _, k in log} <= {"add"} and len(log) <= 1


def test_itl_load_that_scales_with_the_fleet_settles() -> None:
    """Tokens at 0.6 s / workers: grow to 4 (150 ms, inside the band), then hold."""
    log = run(CFG, list(busy(1, 0.6)), lambda n: 0.6 / n, until=900.0)
    assert log == [(0.0, "add"), (60.0, "add"), (120.0, "add")]


def test_a_switch_that_would_starve_the_decode_pool_is_not_made() -> None:
    cfg = replace(
        CFG, both=RoleBounds(0, 0), prefill=RoleBounds(1, 3), decode=RoleBounds(1, 3), max_workers=4
    )
    prefill_heavy = tuple(WorkerView(f"p{i}", "prefill", num_waiting=6, kv_usage=0.1) for i in range(2))
    # decode queues empty but tokens at 150 ms against 200: keep both decode workers
    p = build_planner(cfg)
    for t in range(0, 300, 5):
        assert p.decide(Observation(float(t), (*prefill_heavy, *busy(2, 0.15, role="decode")))) == []
    # decoding fast: a decode worker becomes a prefill worker after a window
    p = build_planner(cfg)
    acts = [
        a
        for t in range(0, 300, 5)
        for a in p.decide(Observation(float(t), (*prefill_heavy, *busy(2, 0.05, role="decode"))))
    ]
    assert isinstance(acts[0], SwitchRole) and acts[0].role == "prefill"


def test_itl_low_must_be_a_fraction() -> None:
    for bad in (0.0, 1.0, 1.5):
        with pytest.raises(ConfigError, match="itl_low"):
            PlannerConfig(itl_low=bad)
