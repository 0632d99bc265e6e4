"""The core's rules for scale to zero and for the hosts' room (issue 29, items 4 and 6): an
empty fleet wakes at once for waiting requests; a pool whose min is 0 stops after
``zero_after_s`` idle and never earlier; adds never exceed the room the hosts report, and a pool
that cannot grow says why."""

from __future__ import annotations

from dataclasses import replace

from interlock.planner import (
    AddWorker,
    Observation,
    PlannerConfig,
    RemoveWorker,
    RoleBounds,
    Traffic,
    WorkerView,
    build_planner,
)

CFG = PlannerConfig(both=RoleBounds(0, 4), window_s=60.0, zero_after_s=300.0, max_changes=100)


def test_requests_at_an_empty_fleet_start_a_worker_at_once() -> None:
    p = build_planner(CFG)
    p.last_change = 100.0  # a change a moment ago: the window would hold an ordinary add
    [a] = p.decide(Observation(101.0, (), router_queue=3))
    assert isinstance(a, AddWorker) and "3 requests wait and no both worker runs" in a.reason
    starting = (WorkerView("new", "both", ready=False),)
    assert p.decide(Observation(106.0, starting, router_queue=5)) == []  # not twice


def test_an_empty_fleet_with_nothing_waiting_stays_empty() -> None:
    p = build_planner(CFG)
    for t in range(0, 600, 5):
        assert p.decide(Observation(float(t), ())) == []


def idle(n: int) -> tuple[WorkerView, ...]:
    return tuple(WorkerView(f"w{i}", "both") for i in range(n))


def test_an_idle_pool_goes_to_zero_after_zero_after_s_and_not_before() -> None:
    p = build_planner(CFG)
    ws = idle(2)
    removed_at = []
    for t in range(0, 900, 5):
        for a in p.decide(Observation(float(t), ws)):
            assert isinstance(a, RemoveWorker)
            ws = tuple(w for w in ws if w.worker_id != a.worker_id)
            removed_at.append((t, a.reason))
    assert len(removed_at) == 2 and not ws
    first, last = removed_at
    assert first[0] < 300 and "queue" in first[1]  # the reactive policy takes it to one ...
    assert last[0] >= 300 and "scaling to zero" in last[1]  # ... only idleness to zero


def test_traffic_keeps_the_last_worker() -> None:
    p = build_planner(CFG)
    ws = idle(1)
    for t in range(0, 900, 5):
        busy = Traffic(5.0, 1) if t % 200 == 0 else Traffic(5.0)  # a request every 200 s
        assert p.decide(Observation(float(t), ws, traffic=busy)) == []


def test_min_one_never_goes_to_zero() -> None:
    p = build_planner(replace(CFG, both=RoleBounds(1, 4)))
    for t in range(0, 900, 5):
        assert p.decide(Observation(float(t), idle(1))) == []


def pressed(n: int) -> tuple[WorkerView, ...]:
    return tuple(WorkerView(f"w{i}", "both", num_running=8, num_waiting=5) for i in range(n))


def test_no_room_on_the_hosts_holds_and_says_why() -> None:
    p = build_planner(CFG)
    obs = Observation(0.0, pressed(2), room=0, room_reason="host local: 2.0 of 2 cores used")
    assert p.decide(obs) == []
    assert "cannot grow" in p.last_hold and "host local: 2.0 of 2 cores used" in p.last_hold
    [a] = p.decide(replace(obs, now=5.0, room=1))
    assert isinstance(a, AddWorker)


def test_a_surge_is_capped_by_the_room() -> None:
    p = build_planner(replace(CFG, both=RoleBounds(1, 16)))
    t = Traffic(5.0, 120, finished=40, met=0)
    busy = tuple(WorkerView(f"w{i}", "both", num_running=8, num_waiting=150) for i in range(4))
    assert p.decide(Observation(-5.0, busy, traffic=t, room=2)) == []  # measuring the service rate
    acts = p.decide(
        Observation(
            0.0,
            tuple(WorkerView(f"w{i}", "both", num_running=8, num_waiting=150) for i in range(4)),
            traffic=t,
            room=2,
        )
    )
    assert len(acts) == 2 and all(isinstance(a, AddWorker) for a in acts)


def test_work_seen_during_a_hold_keeps_the_pool() -> None:
    """Requests that came while the window held every decision still count as work: the pool
    does not scale to zero right after the hold."""
    p = build_planner(CFG)
    ws = idle(1)
    p.decide(Observation(0.0, ws))
    p.last_change = 280.0  # a change: the window holds decisions until 340
    for t in range(280, 345, 5):
        busy = Traffic(5.0, 2) if t == 300 else Traffic(5.0)
        assert p.decide(Observation(float(t), ws, traffic=busy)) == []
    removed = [t for t in range(345, 700, 5) if p.decide(Observation(float(t), ws))]
    assert removed and removed[0] == 600  # 300 s after the work seen at t=300, not before
