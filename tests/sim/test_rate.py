from __future__ import annotations

import pytest

from interlock.errors import ConfigError
from interlock.sim.rate import FAMILY, overlay, parse_curve, tile, warp
from interlock.sim.trace import SimRequest


def uniform(n: int, gap: float = 1.0) -> list[SimRequest]:
    return [SimRequest(f"r{i}", i * gap, 100, 10, ()) for i in range(n)]


def test_steps_multiply_the_rate() -> None:
    out = warp(uniform(400), parse_curve("steps:100x1,50x2,100x1"))
    times = [r.arrival_s for r in out]
    in_first = sum(1 for t in times if t < 100)
    in_high = sum(1 for t in times if 100 <= t < 150)
    assert in_first == 100 and in_high == pytest.approx(100, abs=1)
    assert times[-1] == pytest.approx(399 - 50, abs=0.5)  # 50 s saved by the x2 step
    assert [r.request_id for r in out] == [f"r{i}" for i in range(400)]


def test_diurnal_starts_at_the_trough_and_peaks_mid_period() -> None:
    out = warp(uniform(2000, 0.5), parse_curve("diurnal:period=400,min=1,max=3"))
    times = [r.arrival_s for r in out]
    trough = sum(1 for t in times if t < 20)
    peak = sum(1 for t in times if 190 <= t < 210)
    assert trough == pytest.approx(40, abs=4) and peak == pytest.approx(120, abs=4)


@pytest.mark.parametrize(
    "spec",
    [
        "steps:",
        "steps:10x0",
        "diurnal:period=1,min=2",
        "wave:1",
        "diurnal:period=1,min=1,max=2,phase=3",
        "steps:ax2",
        "ramp:from=1,to=2",
        "ramp:from=1,to=2,over=0",
        "spike:base=1,peak=3,at=10,width=5,height=2",
        "flash:base=2,peak=1,at=0,rise=1,decay=1",
        "step-x9",
    ],
)
def test_bad_curves_are_refused(spec: str) -> None:
    with pytest.raises(ConfigError, match="rate"):
        parse_curve(spec)


def test_tile_repeats_the_trace_with_caches_apart() -> None:
    reqs = [
        SimRequest("a", 0.0, 128, 4, (1, 2), session_id="s"),
        SimRequest("b", 3.0, 128, 4, (1, 3), session_id="s"),
    ]
    out = tile(reqs, 3)
    assert [r.arrival_s for r in out] == [0.0, 3.0, 6.0, 9.0, 12.0, 15.0]
    assert [r.request_id for r in out[2:4]] == ["a#1", "b#1"] and out[3].session_id == "s#1"
    # within a copy the shared prefix stays shared; across copies nothing is
    assert out[2].block_hashes[0] == out[3].block_hashes[0]
    firsts = {r.block_hashes[0] for r in out}
    assert len(firsts) == 3
    assert tile(reqs, 1) == reqs
    with pytest.raises(ConfigError):
        tile(reqs, 0)
    with pytest.raises(ConfigError, match="real tokens"):
        tile([SimRequest("t", 0.0, 64, 1, (1,), token_ids=(5,) * 64)], 2)


def test_overlay_lays_rotated_salted_copies_over_the_same_span() -> None:
    reqs = [SimRequest(f"r{i}", float(i), 128, 4, (1, 2 + i)) for i in range(4)]  # span 4 s
    out = overlay(reqs, 2)
    assert [(r.request_id, r.arrival_s) for r in out] == [
        ("r0", 0.0),
        ("r2#1", 0.0),  # copy 1 starts half the span in and wraps around
        ("r1", 1.0),
        ("r3#1", 1.0),
        ("r2", 2.0),
        ("r0#1", 2.0),
        ("r3", 3.0),
        ("r1#1", 3.0),
    ]
    copy = [r for r in out if r.request_id.endswith("#1")]
    assert len({r.block_hashes[0] for r in copy}) == 1  # the shared prefix within the copy
    assert copy[0].block_hashes[0] != reqs[0].block_hashes[0]  # but not with the original
    assert overlay(reqs, 1) == reqs
    with pytest.raises(ConfigError, match="overlay needs at least one copy"):
        overlay(reqs, 0)


def test_ramp_spike_and_flash_move_the_rate_where_they_say() -> None:
    ramp = parse_curve("ramp:from=1,to=3,over=100,after=50")
    assert (ramp(0), ramp(50), ramp(100), ramp(150), ramp(1000)) == (1, 1, 2, 3, 3)
    down = parse_curve("ramp:from=4,to=1,over=30")
    assert (down(0), down(15), down(30)) == (4, 2.5, 1)
    spike = parse_curve("spike:base=1,peak=4,at=10,width=5")
    assert [spike(t) for t in (9.9, 10, 14.9, 15)] == [1, 4, 4, 1]
    flash = parse_curve("flash:base=1,peak=6,at=100,rise=10,decay=50")
    assert flash(99) == 1 and flash(105) == pytest.approx(3.5) and flash(110) == pytest.approx(6)
    assert flash(160) == pytest.approx(1 + 5 / 2.718281828, rel=1e-6) and flash(2000) == pytest.approx(
        1, abs=1e-9
    )


def test_a_spike_packs_its_requests_into_its_width() -> None:
    out = warp(uniform(400), parse_curve("spike:base=1,peak=4,at=100,width=25"))
    inside = sum(1 for r in out if 100 <= r.arrival_s < 125)
    assert inside == pytest.approx(100, abs=2) and out[-1].arrival_s == pytest.approx(399 - 75, abs=0.5)


@pytest.mark.parametrize("name", sorted(FAMILY))
def test_every_shape_of_the_family_applies_to_a_trace(name: str) -> None:
    curve = parse_curve(name)
    assert all(curve(t) > 0 for t in range(0, 3600, 7))
    out = warp(uniform(300, 2.0), curve)
    assert len(out) == 300 and all(a.arrival_s <= b.arrival_s for a, b in zip(out, out[1:], strict=False))
