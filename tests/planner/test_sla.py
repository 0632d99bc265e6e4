from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest

from interlock.engine.timing import TimingModel
from interlock.planner import (
    AddWorker,
    Observation,
    Planner,
    PlannerConfig,
    RemoveWorker,
    RoleBounds,
    Traffic,
    WorkerView,
    build_planner,
)
from interlock.planner.forecast import ArrivalForecaster, Forecast
from interlock.planner.sla import surge_size
from interlock.planner.state import Arrival
from tests.planner.conftest import mock_profile

CFG = PlannerConfig(
    policy="sla",
    profile="unused.json",
    both=RoleBounds(1, 20),
    window_s=30.0,
    grow_window_s=30.0,
    shrink_window_s=30.0,
    max_changes=100,
    ttft_ms=2000,
    itl_ms=50,
)


def traffic(rate: float, dt: float = 5.0, isl: int = 8000, osl: int = 300) -> Traffic:
    n = round(rate * dt)
    return Traffic(dt, n, n * isl, n * isl // 4, n * osl)


def test_profile_fits_the_mock_timing_model() -> None:
    p = mock_profile()
    t = TimingModel()
    assert p.prefill_s(4096) == pytest.approx(t.step_s(4096, 0, 0.0), rel=1e-6)
    assert p.prefill_s(20_000) == pytest.approx(2 * p.prefill_s(8192) + p.prefill_s(20_000 - 16384))
    assert p.itl_s(64, 4096) == pytest.approx(t.step_s(0, 1, 64 * 4096 / p.kv_tokens), rel=0.02)
    assert p.decode_batch(4096, 0.0001) == 0
    mu = 1 / p.prefill_s(6000)
    assert p.prefill_rate(6000, 2.0, 0.99) == pytest.approx(mu + math.log(0.01) / 2.0)
    assert p.prefill_rate(6000, 2.0, 0.9) > p.prefill_rate(6000, 2.0, 0.99)
    assert p.prefill_rate(6000, 0.1, 0.99) == 0.0  # the target is shorter than one prefill
    agg = p.aggregated_rate(8000, 6000, 300, 2.0, 0.05, 0.99)
    assert 0 < agg <= p.prefill_rate(6000, 2.0, 0.99)


def test_forecast_follows_a_ramp() -> None:
    f = ArrivalForecaster()
    assert f.forecast(60) is None
    for i in range(60):
        f.observe(traffic(1.0 + i * 0.05))
    fc = f.forecast(60.0)
    assert fc is not None and fc.rate > 3.8  # last rate ~3.95 and rising
    assert fc.prompt_tokens == pytest.approx(8000) and fc.uncached_tokens == pytest.approx(6000)


def test_forecast_after_a_step_neither_overshoots_nor_undershoots() -> None:
    # Holt's trend reads a step as a steep ramp: the forecast 120 s ahead passed the new rate
    # by 60% (58 req/s after 6 -> 36) and the level itself by 10%; now within 2%
    up = ArrivalForecaster()
    for i in range(120):
        up.observe(traffic(6.0 if i < 12 else 36.0))
        fc = up.forecast(120.0)
        assert fc is not None and fc.rate <= 36.0 * 1.02
    assert up.forecast(120.0).rate == pytest.approx(36.0, rel=0.01)  # type: ignore[union-attr]
    down = ArrivalForecaster()
    for i in range(120):
        down.observe(traffic(36.0 if i < 60 else 6.0))
        assert down.level is not None and down.level >= 6.0 * 0.99  # no undershoot after a drop
    assert down.level == pytest.approx(6.0, rel=0.01)


def test_a_ramp_keeps_its_trend_and_noise_is_no_level_shift() -> None:
    ramp = ArrivalForecaster()
    for i in range(60):
        ramp.observe(traffic(10.0 + i * 0.25))  # x2.5 in 5 min: steep, but a ramp
        assert not ramp.shifting()
    assert ramp.trend > 0.04
    few = ArrivalForecaster()
    for i in range(60):
        few.observe(traffic((0.2, 0.6)[i % 2]))  # one request, then three: x3 swings of a handful
        assert not few.shifting()


def test_sla_grows_to_the_need_one_step_per_window_then_holds() -> None:
    planner = build_planner(CFG, mock_profile())
    workers = [WorkerView(f"w{i}", "both") for i in range(6)]
    for t in range(0, 600, 5):
        for a in planner.decide(Observation(float(t), tuple(workers), traffic=traffic(50.0))):
            assert isinstance(a, AddWorker)
            workers.append(WorkerView(f"w{len(workers)}", "both"))
    need = planner.policy.last_need["both"]  # type: ignore[attr-defined]
    assert 6 < need < 1.5 * 6  # short, but not a surge
    assert len(workers) == math.ceil(need)
    assert [r.at for r in planner.history] == [0.0, 30.0, 60.0]


def test_surge_size_is_the_shortfall_only_when_arrivals_jump() -> None:
    assert surge_size(36.0, 6.0, 6.25, 2) == 5  # arrivals x6 their level: the whole shortfall
    assert surge_size(9.0, 6.0, 6.25, 2) == 5  # x1.5: still a jump
    assert surge_size(8.9, 6.0, 6.25, 2) == 1  # under x1.5: the ordinary path, one at a time
    assert surge_size(36.0, 6.0, 6.25, 6) == 1  # one worker short: the ordinary path too
    assert surge_size(36.0, 6.0, 4.0, 5) == 1  # the pool already holds it
    assert surge_size(36.0, 0.0, 6.25, 2) == 1  # no level yet
    assert surge_size(36.0, 6.0, math.inf, 2) == 1  # no size the model knows
    assert surge_size(36.0, 6.0, 6.25, 2, factor=0.0) == 1  # surges off (planner.surge: 0)
    assert surge_size(11.0, 6.0, 6.25, 2, factor=2.0) == 1  # under x2 with surge 2


def test_an_arrival_step_adds_the_shortfall_at_once_while_workers_start() -> None:
    planner = build_planner(CFG, mock_profile())
    ready = [WorkerView(f"w{i}", "both") for i in range(2)]
    starting: list[WorkerView] = []
    size: dict[float, int] = {}
    for t in range(0, 90, 5):
        rate = 6.0 if t < 60 else 36.0  # x6 at 60 s
        for a in planner.decide(Observation(float(t), (*ready, *starting), traffic=traffic(rate))):
            assert isinstance(a, AddWorker)
            starting.append(WorkerView(f"w{len(ready) + len(starting)}", "both", ready=False))
        size[float(t)] = len(ready) + len(starting)
        if t % 30 == 25:  # workers take 30 s to start
            ready, starting = ready + [replace(w, ready=True) for w in starting], []
    surges = [r for r in planner.history if "a surge" in r.action.reason]
    assert [r.at for r in surges] == [60.0, 60.0, 65.0, 65.0, 65.0]  # each one decision
    assert "(3 at once)" in surges[-1].action.reason
    one = build_planner(CFG, mock_profile())
    one.decide(Observation(0.0, (WorkerView("w0", "both"),), traffic=traffic(36.0)))
    assert size[65.0] == math.ceil(one.policy.last_need["both"]) == 7  # type: ignore[attr-defined]
    assert size[55.0] == 2 and size[85.0] == 7  # no more while the new ones start


def test_after_a_step_the_pool_settles_at_the_need_without_overshoot() -> None:
    # 6 -> 36 req/s at 60 s: 7 workers hold the new rate (the surge adds them); the trend read
    # from the level catching up used to ask for 10 over the next two minutes
    planner = build_planner(CFG, mock_profile())
    ready = [WorkerView(f"w{i}", "both") for i in range(2)]
    starting: list[WorkerView] = []
    sizes = []
    for t in range(0, 600, 5):
        rate = 6.0 if t < 60 else 36.0
        for a in planner.decide(Observation(float(t), (*ready, *starting), traffic=traffic(rate))):
            assert isinstance(a, AddWorker)
            starting.append(WorkerView(f"w{len(ready) + len(starting)}", "both", ready=False))
        sizes.append(len(ready) + len(starting))
        if t % 30 == 25:
            ready, starting = ready + [replace(w, ready=True) for w in starting], []
    assert max(sizes) == sizes[-1] == 7
    assert planner.policy.last_need["both"] == pytest.approx(6.25, rel=0.01)  # type: ignore[attr-defined]


def test_the_reactive_policy_keeps_one_step_at_a_time() -> None:
    reactive = build_planner(replace(CFG, policy="reactive", profile=None))
    ws = tuple(WorkerView(f"w{i}", "both", num_waiting=50) for i in range(2))
    assert len(reactive.decide(Observation(0.0, ws, traffic=traffic(36.0)))) == 1


def test_a_surge_stays_within_the_bounds_and_the_change_cap() -> None:
    def surge(cfg: PlannerConfig) -> int:
        planner = build_planner(cfg, mock_profile())
        ws = (WorkerView("w0", "both"),)
        assert planner.decide(Observation(0.0, ws, traffic=traffic(4.0))) == []
        return len(planner.decide(Observation(5.0, ws, traffic=traffic(40.0))))

    assert surge(CFG) == 3  # 22 req/s over the last 10 s need 3.8
    assert surge(replace(CFG, max_changes=2)) == 2
    assert surge(replace(CFG, both=RoleBounds(1, 3))) == 2


def test_sla_shrinks_only_with_headroom() -> None:
    planner = build_planner(CFG, mock_profile())
    workers = tuple(WorkerView(f"w{i}", "both") for i in range(10))
    for t in range(0, 60, 5):
        planner.decide(Observation(float(t), workers, traffic=traffic(0.5)))
    # only once the queues stayed low for a whole window (the reactive side agrees)
    first = planner.history[0]
    assert isinstance(first.action, RemoveWorker) and first.at == CFG.window_s - CFG.interval_s


def test_sla_grows_for_a_backlog_the_forecast_does_not_see() -> None:
    planner = build_planner(CFG, mock_profile())
    workers = tuple(WorkerView(f"w{i}", "both", num_waiting=9) for i in range(3))
    [a] = planner.decide(Observation(0.0, workers, traffic=traffic(0.5)))
    assert isinstance(a, AddWorker) and "queue 9.00/worker" in a.reason


def test_sla_sizes_prefill_and_decode_pools() -> None:
    cfg = replace(CFG, both=RoleBounds(0, 0), prefill=RoleBounds(1, 8), decode=RoleBounds(1, 8))
    planner = build_planner(cfg, mock_profile())
    ws = (WorkerView("p0", "prefill"), WorkerView("d0", "decode"))
    planner.decide(Observation(0.0, ws, traffic=traffic(10.0)))
    need = planner.policy.last_need  # type: ignore[attr-defined]
    assert set(need) == {"prefill", "decode"} and need["prefill"] > need["decode"] > 0


def test_observed_misses_size_the_pools_up() -> None:
    def need_after(misses: int, feedback: bool = True) -> float:
        planner = build_planner(replace(CFG, slo_feedback=feedback), mock_profile())
        ws = tuple(WorkerView(f"w{i}", "both") for i in range(3))
        for t in range(0, 120, 5):
            tr = replace(traffic(10.0), finished=100, met=100 - misses)
            planner.decide(Observation(float(t), ws, traffic=tr))
        return planner.policy.last_need["both"]  # type: ignore[attr-defined,no-any-return]

    base = need_after(0)
    assert need_after(1) == pytest.approx(base)  # within the allowed 1%
    assert need_after(4) == pytest.approx(2 * base, rel=0.05)  # sqrt(4% / 1%)
    assert need_after(50) == pytest.approx(2 * base)  # capped
    assert need_after(50, feedback=False) == pytest.approx(base)


def test_sla_shrinks_on_observed_attainment_without_waiting_for_every_reactive_signal() -> None:
    # queues inside the reactive dead band (1 waiting per worker): the reactive side neither
    # grows nor agrees to shrink; the forecast fits in fewer and 100% met over the window
    workers = tuple(WorkerView(f"w{i}", "both", num_waiting=1) for i in range(10))
    planner = build_planner(CFG, mock_profile())
    for t in range(0, 30, 5):
        planner.decide(Observation(float(t), workers, traffic=replace(traffic(0.5), finished=40, met=40)))
    [rec] = planner.history
    assert isinstance(rec.action, RemoveWorker) and "100.0% met the targets over 30s" in rec.action.reason
    # the same while too many missed: no removal
    planner = build_planner(CFG, mock_profile())
    for t in range(0, 60, 5):
        planner.decide(Observation(float(t), workers, traffic=replace(traffic(0.5), finished=40, met=38)))
    assert planner.history == []


def test_sla_does_not_shrink_on_attainment_while_arrivals_rise() -> None:
    workers = tuple(WorkerView(f"w{i}", "both", num_waiting=1) for i in range(10))
    planner = build_planner(CFG, mock_profile())
    for i, t in enumerate(range(0, 60, 5)):
        tr = replace(traffic(0.2 + 0.1 * i), finished=40, met=40)
        planner.decide(Observation(float(t), workers, traffic=tr))
    assert planner.history == []


def test_a_steep_smooth_rise_grows_step_by_step_without_a_surge() -> None:
    # arrivals doubling every minute (far steeper than a day's rise): the 10 s arrivals stay
    # within 1.5x the smoothed level, so the pool grows by ordinary steps, never past the holds
    planner = build_planner(replace(CFG, both=RoleBounds(1, 200)), mock_profile())
    workers = [WorkerView("w0", "both")]
    for t in range(0, 300, 5):
        for a in planner.decide(Observation(float(t), tuple(workers), traffic=traffic(2.0 * 2 ** (t / 60)))):
            assert isinstance(a, AddWorker) and "a surge" not in a.reason
            workers.append(WorkerView(f"w{len(workers)}", "both"))
    assert len(workers) >= 6  # grown, one step per grow window


def run_plant(
    cfg: PlannerConfig, rate_at: Callable[[int], float], start: int, until: int = 3600
) -> tuple[Planner, list[int], float]:
    """The SLA planner over a small closed loop: a pool meets the targets while it has at least
    ``PLANT_RATIO`` times the model's need (ready workers), else 5% of its requests miss; added
    workers take 30 s to start. Returns the planner, the pool size per 5 s and the miss share."""
    planner = build_planner(cfg, mock_profile())
    per = planner.policy.needs(Forecast(1.0, 8000, 6000, 300))["both"]  # type: ignore[attr-defined]
    ws: list[WorkerView] = [WorkerView(f"w{i}", "both") for i in range(start)]
    born: dict[str, int] = {}
    sizes, missed, total = [], 0, 0
    for t in range(0, until, 5):
        ws = [w if w.ready or t - born[w.worker_id] < 30 else replace(w, ready=True) for w in ws]
        rate = rate_at(t)
        n = round(rate * 5)
        short = sum(w.ready for w in ws) < PLANT_RATIO * per * rate
        met = n - math.ceil(0.05 * n) if short else n
        missed, total = missed + n - met, total + n
        tr = Traffic(5.0, n, n * 8000, n * 2000, n * 300, finished=n, met=met)
        for a in planner.decide(Observation(float(t), tuple(ws), traffic=tr)):
            if isinstance(a, AddWorker):
                born[f"n{t}.{len(ws)}"] = t
                ws.append(WorkerView(f"n{t}.{len(ws)}", "both", ready=False))
            else:
                assert isinstance(a, RemoveWorker)
                ws = [w for w in ws if w.worker_id != a.worker_id]
        sizes.append(len(ws))
    return planner, sizes, missed / total


PLANT_RATIO = 1.6
"""The plant's real need over the model's: more than the 50% headroom covers."""

DESCENT = replace(CFG, headroom=0.5, window_s=60.0, grow_window_s=30.0, attainment=0.985)


def turnarounds(planner: Planner) -> int:
    """Adds that come right after a removal (a flap is a removal then an add)."""
    kinds = [type(r.action) for r in planner.history]
    return sum(1 for a, b in zip(kinds, kinds[1:], strict=False) if a is RemoveWorker and b is AddWorker)


def test_no_flapping_on_a_hovering_load_the_model_underestimates() -> None:
    # 30 req/s +-10% every 20 s: the headroom rule removes into misses, the feedback grows
    # the pool back, the correction fades, and the same removal came again every two minutes
    # (28 turnarounds in the hour); a removal turned back from is not repeated for 30 min
    hover = replace(DESCENT, shrink_window_s=30.0)
    planner, sizes, missed = run_plant(hover, lambda t: 30.0 + (3.0 if (t // 20) % 2 else -3.0), 16)
    assert turnarounds(planner) <= 2  # the first, and one retry once the memory has passed
    assert missed < 0.005
    assert set(sizes[100:400]) == {10}  # held one step above the size it turned back from


def test_a_falling_load_is_followed_without_turning_back() -> None:
    # 50 req/s for 10 min, then down to 15 over 10 min, then steady: the pool follows the load
    # down (no size refuted on the way) and settles once, without a removal-add cycle per window
    def fall(t: int) -> float:
        return 50.0 if t < 600 else max(15.0, 50.0 - (t - 600) * 35 / 600)

    planner, sizes, missed = run_plant(replace(DESCENT, shrink_window_s=30.0), fall, 16)
    assert sizes[119] >= 14 and sizes[260] <= 5 + 1  # 5 workers hold 15 req/s here
    assert turnarounds(planner) <= 2
    assert missed < 0.01


def need_for(
    prompts: list[int],
    rate: float = 20.0,
    *,
    burst: int = 1,
    one_by_one: bool = True,
    cfg: PlannerConfig = CFG,
) -> dict[str, float]:
    """The SLA policy's need after 5 min of ``rate`` req/s whose prompt lengths cycle through
    ``prompts``, ``burst`` requests at one instant (``one_by_one``: the connector reports each
    request, else means alone)."""
    planner = build_planner(cfg, mock_profile())
    ws = tuple(WorkerView(f"w{i}", "both") for i in range(20))
    n, k = round(rate * 5), 0
    for t in range(0, 300, 5):
        lengths = [prompts[(k + i) % len(prompts)] for i in range(n)]
        k += n
        at = [t + (i // burst) * burst / rate for i in range(n)]
        arrivals = (
            tuple(Arrival(a, x, 0, 300) for a, x in zip(at, lengths, strict=True)) if one_by_one else ()
        )
        tr = Traffic(5.0, n, sum(lengths), 0, n * 300, arrivals=arrivals)
        planner.decide(Observation(float(t), ws, traffic=tr))
    return planner.policy.last_need  # type: ignore[attr-defined,no-any-return]


EXPONENTIAL = [round(-4900 * math.log1p(-(i + 0.5) / 200)) for i in range(0, 200, 2)] + [
    round(-4900 * math.log1p(-(i + 0.5) / 200)) for i in range(199, 0, -2)
]
"""Prompt lengths of mean about 4,900, spread as an exponential, interleaved short and long."""
HEAVY = [2000] * 19 + [60_000]
"""The same mean, from one long prompt in twenty."""


def test_requests_seen_one_by_one_size_the_pool_for_their_spread() -> None:
    # the means' model sees neither bursts nor long prompts; the queueing model does
    means = need_for([4900], one_by_one=False)["both"]
    assert need_for(EXPONENTIAL)["both"] == pytest.approx(means, rel=0.15)  # Poisson-like: about the same
    trough = need_for(HEAVY, 3.0, one_by_one=False)["both"]
    assert need_for(HEAVY, 3.0)["both"] > trough  # long prompts at a trough
    assert need_for(HEAVY, 3.0, burst=6)["both"] > 2 * trough  # ...arriving six at a time
    dis = replace(CFG, both=RoleBounds(0, 0), prefill=RoleBounds(1, 20), decode=RoleBounds(1, 20))
    prefill = need_for([4900], one_by_one=False, cfg=dis)["prefill"]
    assert need_for([4900], cfg=dis)["prefill"] < prefill  # a pool pools: fewer than n M/M/1 queues
    assert (
        need_for(HEAVY, 3.0, burst=6, cfg=dis)["prefill"]
        > need_for(HEAVY, 3.0, one_by_one=False, cfg=dis)["prefill"]
    )


def test_a_bursty_trough_does_not_take_the_pool_down_and_up() -> None:
    # 3 req/s in bursts (one to eleven requests at one instant), one prompt in twenty 60k
    # tokens, every request meeting the targets: the smoothed rate and the mean prompt swing
    # from one observation to the next, and a removal at a low swing came back as an add at
    # the next high one (the x6 step's long trough); the removal must fit the rate's noise
    rng = np.random.default_rng(1)
    cfg = replace(DESCENT, shrink_window_s=30.0, both=RoleBounds(1, 10))
    planner = build_planner(cfg, mock_profile())
    ws = [WorkerView(f"w{i}", "both") for i in range(6)]
    for t in range(0, 3600, 5):
        arrivals: list[Arrival] = []
        for _ in range(rng.poisson(5 * 3.0 / 6)):  # bursts of 6 on average
            at = t + float(rng.uniform(0, 5))
            arrivals += [Arrival(at, int(rng.choice(HEAVY)), 0, 300) for _ in range(rng.integers(1, 12))]
        arrivals.sort(key=lambda a: a.at)
        n = len(arrivals)
        tr = Traffic(
            5.0, n, sum(a.prompt_tokens for a in arrivals), 0, 300 * n, n, n, arrivals=tuple(arrivals)
        )
        for act in planner.decide(Observation(float(t), tuple(ws), traffic=tr)):
            if isinstance(act, AddWorker):
                ws.append(WorkerView(f"n{t}", "both"))
            else:
                ws = [w for w in ws if w.worker_id != act.worker_id]
    assert turnarounds(planner) == 0
    assert 2 <= len(ws) < 6  # it did come down
