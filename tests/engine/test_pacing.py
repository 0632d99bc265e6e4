"""Load reports paced: at most one per interval, the latest always delivered by the interval's end."""

import pytest

from interlock.engine.pacing import LOAD_INTERVAL_S, ReportPacer
from interlock.engine.worker import WorkerOptions


def drive(pacer: ReportPacer[str], made: list[tuple[float, str]]) -> list[tuple[float, str, float]]:
    """Reports made at the given times, with a timer that calls ``due`` when asked: what left
    and when (time, report, seconds held)."""
    timers: list[float] = []
    out: list[tuple[float, str, float]] = []
    for t, r in made:
        while timers and timers[0] < t:
            got = pacer.due(timers.pop(0))
            if got is not None:
                out.append((pacer._last, got[0], got[1]))
        send, wake = pacer.offer(r, t)
        if send is not None:
            out.append((t, send, 0.0))
        if wake is not None:
            timers.append(wake)
    for w in timers:
        got = pacer.due(w)
        if got is not None:
            out.append((w, got[0], got[1]))
    return out


def test_a_busy_worker_sends_one_report_per_interval_the_latest() -> None:
    p: ReportPacer[str] = ReportPacer(0.05)
    steps = [(round(0.012 * i, 6), f"s{i}") for i in range(12)]  # a step every 12 ms
    sent = drive(p, steps)
    assert [r for _, r, _ in sent] == ["s0", "s4", "s8", "s11"]
    assert [round(t, 6) for t, _, _ in sent] == [0.0, 0.05, 0.1, 0.15]
    # each held one says how old it is: made at 48, 96 and 132 ms
    assert [round(h, 6) for _, _, h in sent] == [0.0, 0.002, 0.004, 0.018]


def test_the_last_state_before_idle_is_delivered_within_the_interval() -> None:
    p: ReportPacer[str] = ReportPacer(0.05)
    sent = drive(p, [(0.0, "busy"), (0.02, "idle")])
    assert sent[-1][1] == "idle" and sent[-1][0] == pytest.approx(0.05)


def test_a_quiet_worker_reports_at_once_and_zero_paces_nothing() -> None:
    p: ReportPacer[str] = ReportPacer(0.05)
    assert drive(p, [(0.0, "a"), (1.0, "b"), (2.5, "c")]) == [
        (0.0, "a", 0.0),
        (1.0, "b", 0.0),
        (2.5, "c", 0.0),
    ]
    z: ReportPacer[str] = ReportPacer(0.0)
    assert [r for _, r, _ in drive(z, [(0.0, "a"), (0.0, "b"), (0.001, "c")])] == ["a", "b", "c"]


def test_a_report_sent_outside_the_pacer_drops_the_older_held_one() -> None:
    p: ReportPacer[str] = ReportPacer(0.05)
    assert p.offer("a", 0.0) == ("a", None)
    assert p.offer("b", 0.01) == (None, 0.05)
    assert p.offer("c", 0.02) == (None, None)  # the timer is already set
    p.sent(0.03)  # an idle report with the current state
    assert p.due(0.05) is None
    assert p.offer("d", 0.06) == (None, 0.08)


def test_the_interval_is_one_definition_and_a_negative_one_is_refused() -> None:
    assert WorkerOptions().load_interval_s == LOAD_INTERVAL_S
    with pytest.raises(ValueError, match="interval"):
        ReportPacer(-1.0)
