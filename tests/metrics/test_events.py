"""The event log keeps the newest events, oldest first, with wall-clock times."""

from __future__ import annotations

from interlock.metrics.events import Event, EventLog


def test_the_log_keeps_its_newest_events_oldest_first() -> None:
    times = iter(range(100))
    log = EventLog(capacity=3, clock=lambda: float(next(times)))
    for i in range(5):
        log.record("restart", f"worker-{i}", "exit -9")
    assert len(log) == 3
    assert log.recent() == [Event(float(i), "restart", f"worker-{i}", "exit -9") for i in (2, 3, 4)]
    assert [e.subject for e in log.recent(2)] == ["worker-3", "worker-4"]
    assert log.recent(0) == []
