from __future__ import annotations

from dataclasses import replace

import pytest

from interlock.errors import ConfigError
from interlock.planner import (
    AddWorker,
    Observation,
    Planner,
    PlannerConfig,
    RemoveWorker,
    RoleBounds,
    SwitchRole,
    WorkerView,
    build_planner,
)
from interlock.planner.policy import Want

CFG = PlannerConfig(
    both=RoleBounds(1, 4), window_s=60.0, grow_window_s=60.0, shrink_window_s=60.0, max_changes=100
)
"""Every step a whole window apart (the defaults let an add follow an add, a removal a removal,
in half of it)."""


def fleet(*waiting: int, role: str = "both", kv: float = 0.1) -> tuple[WorkerView, ...]:
    return tuple(WorkerView(f"{role[0]}{i}", role, num_waiting=q, kv_usage=kv) for i, q in enumerate(waiting))


class Sim:
    """Applies the planner's actions to a list of workers (instantly ready)."""

    def __init__(self, planner: Planner, workers: tuple[WorkerView, ...]) -> None:
        self.planner = planner
        self.workers = list(workers)
        self.n = len(workers)
        self.log: list[tuple[float, str]] = []

    def tick(self, now: float, waiting_per_worker: float, kv: float = 0.1, role: str = "both") -> None:
        ws = tuple(replace(w, num_waiting=round(waiting_per_worker), kv_usage=kv) for w in self.workers)
        obs = Observation(now, ws, router_queue=round((waiting_per_worker % 1) * len(ws)))
        for a in self.planner.decide(obs):
            if isinstance(a, AddWorker):
                self.workers.append(WorkerView(f"n{self.n}", a.role))
                self.n += 1
                self.log.append((now, "add"))
            elif isinstance(a, RemoveWorker):
                self.workers = [w for w in self.workers if w.worker_id != a.worker_id]
                self.log.append((now, "remove"))


def first_action(p: Planner, workers: tuple[WorkerView, ...], until: float = 300.0) -> list:  # type: ignore[type-arg]
    """The first decision on a steady observation, ticking every 5 s."""
    t = 0.0
    while t <= until:
        acts = p.decide(Observation(t, workers))
        if acts:
            return acts
        t += 5.0
    return []


def test_prefill_backlog_grows_the_pool() -> None:
    ws = tuple(
        WorkerView(f"w{i}", "both", queued_prefill_tokens=30_000, prefill_tokens_per_s=10_000)
        for i in range(2)
    )
    [a] = build_planner(CFG).decide(Observation(0.0, ws))
    assert isinstance(a, AddWorker) and "prefill backlog 3.00s > 2s" in a.reason


def test_one_step_per_window_under_sustained_load() -> None:
    sim = Sim(build_planner(CFG), fleet(5))
    for t in range(0, 400, 5):
        sim.tick(float(t), 5.0)
    assert sim.log == [(0.0, "add"), (60.0, "add"), (120.0, "add")]  # then max 4 reached
    assert len(sim.workers) == 4


def test_no_flapping_on_a_load_hovering_at_the_high_threshold() -> None:
    sim = Sim(build_planner(replace(CFG, queue_high=2.0)), fleet(2, 2))
    for i, t in enumerate(range(0, 1200, 5)):
        sim.tick(float(t), 2.0 + (0.2 if i % 2 else -0.2))
    kinds = {k for _, k in sim.log}
    assert kinds <= {"add"}


def test_no_flapping_on_a_load_hovering_at_the_low_threshold() -> None:
    sim = Sim(build_planner(replace(CFG, queue_low=0.2)), fleet(0, 0, 0, 0))
    for i, t in enumerate(range(0, 1200, 5)):
        sim.tick(float(t), 0.2 + (0.1 if i % 2 else -0.1))
    kinds = [k for _, k in sim.log]
    assert set(kinds) <= {"remove"}
    assert len(sim.workers) >= 1


def test_shrinks_after_the_load_falls_and_never_below_min() -> None:
    sim = Sim(build_planner(CFG), fleet(0, 0, 0, 0))
    for t in range(0, 1000, 5):
        sim.tick(float(t), 0.0)
    assert [k for _, k in sim.log] == ["remove"] * 3
    # a whole window of low load at each size before each removal
    assert [t for t, _ in sim.log] == [55.0, 120.0, 185.0]
    assert len(sim.workers) == 1


def test_starting_worker_holds_decisions() -> None:
    p = build_planner(CFG)
    ws = (*fleet(9), WorkerView("new", "both", ready=False))
    assert p.decide(Observation(100.0, ws)) == []
    assert "start" in p.last_hold


def test_change_cap() -> None:
    p = build_planner(
        replace(
            CFG,
            both=RoleBounds(1, 50),
            window_s=1.0,
            grow_window_s=1.0,
            shrink_window_s=1.0,
            max_changes=3,
            cap_window_s=100.0,
        )
    )
    sim = Sim(p, fleet(9))
    for t in range(0, 200, 5):
        sim.tick(float(t), 9.0)
    assert [t for t, _ in sim.log] == [0.0, 5.0, 10.0, 100.0, 105.0, 110.0]
    assert "cap" in p.last_hold


def test_the_change_cap_counts_adds_and_removals_apart() -> None:
    """A surge's adds fill the add cap; the removals that follow once the load is gone are not
    held by it (a spike's adds used to hold its whole fleet, idle, for the rest of the cap
    window), and a further add still is."""
    asks = Asks(5)
    p = Planner(replace(CFG, both=RoleBounds(1, 10), max_changes=5, cap_window_s=600.0), asks)
    assert len(p.decide(Observation(0.0, fleet(0)))) == 5
    asks.delta, asks.surge = -1, False
    six = fleet(*[0] * 6)
    assert [type(a) for a in p.decide(Observation(100.0, six))] == [RemoveWorker]
    asks.delta = 1
    assert p.decide(Observation(200.0, fleet(*[0] * 5))) == []
    assert p.last_hold == "5 workers added or switched in the last 600s (cap 5)"
    assert p.holding(200.0) is False  # removals may still come
    asks.delta = -1
    assert len(p.decide(Observation(300.0, fleet(*[0] * 5)))) == 1


def test_the_default_change_cap_grows_with_the_fleet() -> None:
    assert replace(CFG, max_changes=0).change_cap() == 6
    big = replace(
        CFG, both=RoleBounds(1, 20), window_s=1.0, grow_window_s=1.0, shrink_window_s=1.0, max_changes=0
    )
    assert big.change_cap() == 20
    p = build_planner(big)
    sim = Sim(p, fleet(9))
    for t in range(0, 200, 5):
        sim.tick(float(t), 9.0)
    assert len(sim.log) == 19  # from 1 worker to the max of 20 within one cap window (a fixed 6 stopped at 7)


def test_bounds_pull_a_fleet_back_inside() -> None:
    p = build_planner(replace(CFG, both=RoleBounds(2, 3)))
    [a] = p.decide(Observation(0.0, fleet(9, 9, 9, 9, 0)))
    assert isinstance(a, RemoveWorker) and a.worker_id == "b4" and "> max 3" in a.reason
    p = build_planner(replace(CFG, both=RoleBounds(2, 3)))
    [a] = p.decide(Observation(0.0, fleet(0)))
    assert a == AddWorker("both", "1 both workers < min 2")


def test_grow_stops_at_max_workers() -> None:
    p = build_planner(replace(CFG, both=RoleBounds(1, 8), max_workers=2))
    assert p.decide(Observation(0.0, fleet(9, 9))) == []


def test_scale_down_removes_the_cheapest_worker() -> None:
    ws = (
        WorkerView("busy", "both", num_running=3, kv_usage=0.1, age_s=500),
        WorkerView("cachey", "both", num_running=0, unique_blocks=640, kv_usage=0.1, age_s=500),
        WorkerView("cheap", "both", num_running=1, unique_blocks=0, kv_usage=0.1, age_s=500),
        WorkerView("cheap-young", "both", num_running=1, unique_blocks=0, kv_usage=0.1, age_s=50),
    )
    [a] = first_action(build_planner(CFG), ws)
    assert isinstance(a, RemoveWorker) and a.worker_id == "cheap-young"


def test_kv_usage_grows_and_projected_kv_blocks_shrink() -> None:
    p = build_planner(CFG)
    [a] = p.decide(Observation(0.0, fleet(0, 0, kv=0.9)))
    assert isinstance(a, AddWorker) and "kv usage 0.90" in a.reason
    # 0.45 < kv_low, but two workers' KV on one would be 0.9 > kv_high: keep both
    assert build_planner(CFG).decide(Observation(0.0, fleet(0, 0, kv=0.45))) == []


def test_roles_follow_the_mix_with_hysteresis() -> None:
    cfg = replace(
        CFG, both=RoleBounds(0, 0), prefill=RoleBounds(1, 3), decode=RoleBounds(1, 3), max_workers=4
    )
    p = build_planner(cfg)
    prefill_heavy = (*fleet(6, 6, role="prefill"), *fleet(0, 0, role="decode"))
    [a] = first_action(p, prefill_heavy)
    assert isinstance(a, SwitchRole) and a.role == "prefill" and a.worker_id.startswith("d")
    assert p.history[0].at == 55.0  # the decode side must have been idle for a window
    # prefill over its threshold but decode inside the band: no switch, no growth (fleet full)
    p = build_planner(cfg)
    mixed = (*fleet(6, 6, role="prefill"), *fleet(1, 1, role="decode"))
    assert first_action(p, mixed) == []


def test_decisions_are_logged_with_reasons() -> None:
    p = build_planner(CFG)
    p.decide(Observation(3.0, fleet(9)))
    [rec] = p.history
    assert rec.kind == "add" and rec.to_dict()["role"] == "both"
    assert rec.line().startswith("t=3.0s add both worker: queue 9.00/worker > 2")


def test_nothing_needed_nothing_done() -> None:
    p = build_planner(CFG)
    assert p.decide(Observation(0.0, fleet(1, 1, kv=0.6))) == []
    assert p.last_hold == "nothing to do"


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_empty_role_pool_gets_its_min(role: str) -> None:
    cfg = replace(CFG, **{role: RoleBounds(1, 2)})  # type: ignore[arg-type]
    [a] = build_planner(cfg).decide(Observation(0.0, fleet(0)))
    assert a == AddWorker(role, f"0 {role} workers < min 1")


def test_min_workers_keeps_the_fleet_size_but_roles_still_move() -> None:
    cfg = replace(
        CFG,
        both=RoleBounds(0, 0),
        prefill=RoleBounds(1, 3),
        decode=RoleBounds(1, 3),
        min_workers=4,
        max_workers=4,
    )
    idle = (*fleet(0, 0, role="prefill"), *fleet(0, 0, role="decode"))
    assert first_action(build_planner(cfg), idle) == []
    [a] = first_action(build_planner(cfg), (*fleet(0, 0, role="prefill"), *fleet(6, 6, role="decode")))
    assert isinstance(a, SwitchRole) and a.role == "decode"


def test_grow_window_lets_adds_follow_adds_sooner_but_not_removals() -> None:
    sim = Sim(build_planner(replace(CFG, both=RoleBounds(1, 5), grow_window_s=30.0)), fleet(5))
    for t in range(0, 100, 5):
        sim.tick(float(t), 5.0)
    assert sim.log == [(0.0, "add"), (30.0, "add"), (60.0, "add"), (90.0, "add")]
    # after an add, a removal still waits the whole window (and a whole window of low load)
    p = sim.planner
    p.decide(Observation(100.0, tuple(sim.workers)))
    assert p.last_hold.startswith("observing: 10s of the 60s window")
    for t in range(100, 400, 5):
        sim.tick(float(t), 0.0)
    assert sim.log[4][1] == "remove" and sim.log[4][0] >= 90.0 + CFG.window_s


def test_grow_window_must_fit_in_the_window() -> None:
    with pytest.raises(ConfigError, match="grow_window_s"):
        PlannerConfig(window_s=30.0, grow_window_s=60.0)


def test_shrink_window_lets_removals_follow_removals_sooner_but_not_an_add() -> None:
    cfg = replace(CFG, both=RoleBounds(1, 10), shrink_window_s=30.0)
    p = Planner(cfg, Asks(-1, surge=False))
    ws = list(fleet(*[0] * 8))
    for t in range(0, 100, 5):
        for a in p.decide(Observation(float(t), tuple(ws))):
            assert isinstance(a, RemoveWorker)
            ws = [w for w in ws if w.worker_id != a.worker_id]
    assert [r.at for r in p.history] == [0.0, 30.0, 60.0, 90.0]
    # turning round: an add after a removal waits the whole window
    p.policy = Asks(1, surge=False)
    assert p.decide(Observation(120.0, tuple(ws))) == []
    assert p.last_hold.startswith("observing: 30s of the 60s window")
    assert len(p.decide(Observation(150.0, tuple(ws)))) == 1


def test_shrink_window_must_fit_in_the_window() -> None:
    with pytest.raises(ConfigError, match="shrink_window_s"):
        PlannerConfig(window_s=30.0, shrink_window_s=60.0)
    with pytest.raises(ConfigError, match="shrink_window_s"):
        PlannerConfig(shrink_window_s=-1.0)
    assert PlannerConfig(window_s=60.0).remove_window_s() == 30.0
    assert PlannerConfig(window_s=60.0).add_window_s() == 30.0


class Asks:
    """A policy that asks for ``delta`` workers of the aggregated pool at every observation
    (a surge by default)."""

    def __init__(self, delta: int, surge: bool = True) -> None:
        self.delta, self.surge = delta, surge

    def wants(self, obs: Observation, pools: dict[str, list[WorkerView]]) -> list[Want]:
        return [Want("both", self.delta, 9.0, "asked", surge=self.surge)]

    def status(self) -> dict[str, object]:
        return {}


def test_a_surge_is_several_adds_in_one_decision_past_the_holds() -> None:
    p = Planner(replace(CFG, both=RoleBounds(1, 10), max_changes=6), Asks(5))
    p.last_change = 0.0  # a change a moment ago: the window holds the ordinary path
    ws = (*fleet(0), WorkerView("new", "both", ready=False))  # and so does a starting worker
    acts = p.decide(Observation(5.0, ws))
    assert len(acts) == 5 and all(isinstance(x, AddWorker) and "(5 at once)" in x.reason for x in acts)
    assert [r.at for r in p.history] == [5.0] * 5


@pytest.mark.parametrize(
    ("workers", "max_changes", "adds"),
    [(9, 100, 1), (7, 100, 3), (1, 3, 3), (1, 2, 2)],  # 9 of max 10: one add, the ordinary path
)
def test_a_surge_stays_within_max_and_the_change_cap(workers: int, max_changes: int, adds: int) -> None:
    p = Planner(replace(CFG, both=RoleBounds(1, 10), max_changes=max_changes), Asks(5))
    assert len(p.decide(Observation(0.0, fleet(*[0] * workers)))) == adds


def test_a_surge_of_one_takes_the_ordinary_path_and_its_holds() -> None:
    p = Planner(replace(CFG, both=RoleBounds(1, 10)), Asks(5))
    ws = (*fleet(*[0] * 8), WorkerView("new", "both", ready=False))  # room for one only
    assert p.decide(Observation(0.0, ws)) == [] and "start" in p.last_hold


@pytest.mark.parametrize(
    ("workers", "delta", "share", "moved"),
    [(20, 5, 0.1, 2), (30, 5, 0.1, 3), (30, 2, 0.1, 2), (5, 5, 0.1, 1), (30, 5, 0.0, 1), (30, -5, 0.1, 3)],
)
def test_a_step_moves_up_to_a_share_of_the_pool(workers: int, delta: int, share: float, moved: int) -> None:
    cfg = replace(CFG, both=RoleBounds(1, 40), step_share=share)
    p = Planner(cfg, Asks(delta, surge=False))
    ws = tuple(WorkerView(f"w{i}", "both", num_running=i % 4, age_s=100.0) for i in range(workers))
    acts = p.decide(Observation(0.0, ws))
    assert len(acts) == moved and len({type(a) for a in acts}) == 1
    if delta < 0:  # the cheapest: fewest requests in flight
        assert sorted(a.worker_id for a in acts) == ["w0", "w12", "w16"]  # type: ignore[union-attr]
    if moved > 1:
        assert f"({moved} at once)" in acts[0].reason
    assert p.decide(Observation(5.0, ws)) == []  # the next step waits for the window


def test_step_share_is_checked() -> None:
    with pytest.raises(ConfigError, match="step_share"):
        PlannerConfig(step_share=1.5)
