"""The live connector against the in-package fakes: a stepped load (low, high, low)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from interlock.cli.main import main
from interlock.planner import PlannerConfig, RoleBounds, build_planner
from interlock.planner.fleet import FakeFleet
from interlock.planner.loop import FakeLoadView, PlannerLoop, TrafficTotals
from interlock.planner.status import serve_status
from interlock.protocol.events import LoadReport
from interlock.protocol.routing import Completion
from tests.factories import load_report

CFG = PlannerConfig(
    both=RoleBounds(1, 4),
    window_s=30.0,
    grow_window_s=30.0,
    shrink_window_s=30.0,
    interval_s=5.0,
    max_changes=100,
)


def report(wid: str, waiting: int) -> LoadReport:
    return load_report(
        wid,
        num_running=4,
        num_waiting=waiting,
        kv_blocks_used=10,
        kv_blocks_total=100,
        step_time_s=0.01,
        tokens_computed=4,
    )


class Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


async def stepped(
    loop: PlannerLoop, fleet: FakeFleet, view: FakeLoadView, clock: Clock
) -> list[tuple[float, int]]:
    """Tick for 600 s: 20 waiting requests spread over the fleet from 60 s to 240 s."""
    sizes = []
    while clock.t <= 600:
        ready = [w for w in await fleet.workers() if w.ready and not w.draining]
        load = 20 if 60 <= clock.t < 240 else 0
        for w in ready:
            view.reports[w.worker_id] = report(w.worker_id, load // len(ready))
        await loop.tick()
        fleet.start()  # workers start within one interval
        fleet.finish_drains()
        sizes.append((clock.t, len([w for w in await fleet.workers() if not w.draining])))
        clock.t += 5.0
    return sizes


def test_stepped_load_adds_one_at_a_time_then_removes() -> None:
    clock, fleet, view = Clock(), FakeFleet({"both": 1}), FakeLoadView()
    loop = PlannerLoop(build_planner(CFG), fleet, view, clock=clock)
    sizes = asyncio.run(stepped(loop, fleet, view, clock))
    kinds = [k for k, _ in fleet.calls]
    assert kinds == ["add", "add", "add", "remove", "remove", "remove"]
    times = [r.at for r in loop.planner.history]
    assert all(b - a >= CFG.window_s for a, b in zip(times, times[1:], strict=False))
    assert times[0] >= 60 and times[3] >= 240  # grows in the high phase, shrinks after it
    steps = [b - a for (_, a), (_, b) in zip(sizes, sizes[1:], strict=False)]
    assert set(steps) <= {-1, 0, 1} and sizes[-1][1] == 1


def test_status_over_http_and_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    async def go() -> str:
        clock, fleet, view = Clock(), FakeFleet({"both": 1}), FakeLoadView()
        loop = PlannerLoop(build_planner(CFG), fleet, view, clock=clock)
        view.reports["w0"] = report("w0", 9)
        await loop.tick()
        decided = loop.status()["decisions"][0]  # type: ignore[index]
        stamp = time.mktime(time.strptime(decided["time"][:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone
        assert decided["time"].endswith("Z") and abs(stamp - time.time()) < 60  # wall-clock, UTC
        server = await serve_status(loop)
        port = server.sockets[0].getsockname()[1]
        rc = await asyncio.to_thread(main, ["planner", "status", "--url", f"http://127.0.0.1:{port}"])
        assert rc == 0
        async with httpx.AsyncClient() as c:
            metrics = (await c.get(f"http://127.0.0.1:{port}/metrics")).text
            missing = (await c.get(f"http://127.0.0.1:{port}/nope")).status_code
        server.close()
        await server.wait_closed()
        assert missing == 404
        return metrics

    metrics = asyncio.run(go())
    out = capsys.readouterr().out
    assert "policy    reactive" in out
    assert "t=0.0s add both worker: queue 9.00/worker > 2" in out
    assert 'interlock_planner_decisions_total{kind="add"} 1' in metrics
    assert 'interlock_planner_replicas{role="both",state="current"} 1' in metrics
    assert 'interlock_planner_replicas{role="both",state="desired"} 2' in metrics


def test_status_cli_names_an_unreachable_planner(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["planner", "status", "--url", "http://127.0.0.1:9"]) == 1
    assert "cannot read http://127.0.0.1:9/planner" in capsys.readouterr().err


def test_new_workers_ramp_up_and_old_ones_do_not() -> None:
    cfg = PlannerConfig(both=RoleBounds(1, 4), window_s=30.0, interval_s=5.0, ramp_s=20.0, ramp_floor=0.2)

    async def go() -> list[dict[str, float]]:
        clock, fleet, view = Clock(), FakeFleet({"both": 1}), FakeLoadView()
        loop = PlannerLoop(build_planner(cfg), fleet, view, clock=clock)
        seen = []
        for _ in range(8):
            view.reports["w0"] = report("w0", 9)
            await loop.tick()
            fleet.start()
            seen.append(dict(view.weights))
            clock.t += 5.0
        return seen

    seen = asyncio.run(go())
    assert "w0" not in seen[0] or seen[0]["w0"] == 1.0  # warm at the first look
    ramp = [s["w1"] for s in seen if "w1" in s]
    assert ramp[0] == pytest.approx(0.2) and ramp[-1] == 1.0
    assert ramp == sorted(ramp)


def test_switch_role_goes_through_the_fleet() -> None:
    cfg = PlannerConfig(
        both=RoleBounds(0, 0),
        prefill=RoleBounds(1, 3),
        decode=RoleBounds(1, 3),
        min_workers=4,
        max_workers=4,
        window_s=10.0,
        interval_s=5.0,
    )

    async def go() -> FakeFleet:
        clock, fleet, view = Clock(), FakeFleet({"prefill": 2, "decode": 2}), FakeLoadView()
        loop = PlannerLoop(build_planner(cfg), fleet, view, clock=clock)
        for _ in range(6):
            for w in await fleet.workers():
                view.reports[w.worker_id] = report(w.worker_id, 8 if w.role == "prefill" else 0)
            await loop.tick()
            clock.t += 5.0
        return fleet

    fleet = asyncio.run(go())
    assert fleet.calls[0][0] == "set_role" and fleet.calls[0][1].endswith(":prefill")


def test_finished_requests_become_the_traffic_the_policies_read() -> None:
    clock, fleet, view = Clock(), FakeFleet({"both": 1}), FakeLoadView()
    loop = PlannerLoop(build_planner(CFG), fleet, view, clock=clock)
    asyncio.run(loop.observe())  # the first look only sets the origin
    clock.t = 5.0
    view.traffic = TrafficTotals(requests=4, prompt_tokens=400)
    view.done = [
        Completion(1.0, 0.5, 0.9, 10, 100, 0),  # 100 ms between tokens: over the 50 ms target
        Completion(2.0, 0.5, 0.09, 10, 100, 50),
        Completion(3.0, 3.0, 0.09, 10, 100, 0),  # TTFT over 2 s
        Completion(4.0, 0.1, 0.0, 1, 100, 0),
    ]
    t = asyncio.run(loop.observe()).traffic
    assert (t.duration_s, t.requests, t.finished, t.met) == (5.0, 4, 4, 2)
    assert (t.decode_tokens, t.decode_s) == (27, pytest.approx(1.08))
    assert t.output_tokens == round(31 / 4 * 4)  # the finished requests' mean for the arrivals
    assert [(a.at, a.cached_tokens, a.output_tokens) for a in t.arrivals][:2] == [(1.0, 0, 10), (2.0, 50, 10)]
    assert asyncio.run(loop.observe()).traffic.finished == 0  # each handed over once
