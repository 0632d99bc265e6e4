"""The real clock's sleep keeps a modelled time right on average: short sleeps are owed and
taken together, and what a sleep overshoots comes off the next (``time.sleep`` wakes tens of µs
late). Checked against a fake timer that always wakes late."""

from __future__ import annotations

import pytest

from interlock.engine import clock as clock_module
from interlock.engine.clock import MIN_SLEEP_S, RealClock

LATE = 80e-6


class FakeTime:
    """``time.monotonic`` and a ``time.sleep`` that wakes ``LATE`` after what it is asked."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds + LATE


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeTime:
    t = FakeTime()
    monkeypatch.setattr(clock_module.time, "monotonic", t.monotonic)
    monkeypatch.setattr(clock_module.time, "sleep", t.sleep)
    return t


def test_short_sleeps_are_owed_and_taken_together(fake: FakeTime) -> None:
    clock = RealClock()
    for _ in range(10_000):  # 10,000 steps of 7 µs (a decode step at --speedup 1000): 70 ms
        clock.sleep(7e-6)
    clock.sleep(0.0)
    clock.sleep(-1.0)
    assert all(s >= MIN_SLEEP_S - LATE for s in fake.sleeps)  # never a sleep the timer cannot keep
    assert len(fake.sleeps) < 80
    # slept within one minimum sleep of what was modelled (time.sleep per step: 10,000 x 87 µs)
    assert abs((fake.now - 100.0) - 0.070) < MIN_SLEEP_S


def test_long_sleeps_pay_back_the_overshoot(fake: FakeTime) -> None:
    clock = RealClock()
    for _ in range(100):
        clock.sleep(0.007)  # a decode step at --speedup 1
    assert fake.sleeps[0] == 0.007 and all(s == pytest.approx(0.007 - LATE) for s in fake.sleeps[1:])
    assert abs((fake.now - 100.0) - 0.7) <= LATE + 1e-9
