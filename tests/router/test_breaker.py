"""The circuit breaker's states, as plain calls with explicit times."""

from __future__ import annotations

from interlock.router.breaker import BreakerConfig, Breakers, State

CFG = BreakerConfig(failures=3, window_s=10.0, cooldown_s=5.0, max_cooldown_s=12.0, incident_s=1.0)


def test_opens_after_failures_within_the_window() -> None:
    b = Breakers(CFG)
    assert not b.failure("w", 0.0)
    assert not b.failure("w", 2.0)
    assert b.failure("w", 4.0)
    assert b.state("w") is State.OPEN and b.blocked("w") and b.opened_total == 1


def test_failures_of_one_incident_count_once_and_old_ones_expire() -> None:
    b = Breakers(CFG)
    for t in (0.0, 0.1, 0.2, 0.9):  # a dead worker breaks all its streams at once
        assert not b.failure("w", t)
    assert not b.failure("w", 5.0)
    assert not b.failure("w", 16.0)  # the first two left the 10 s window
    assert b.state("w") is State.CLOSED


def test_one_probe_after_the_cooldown_then_closed_on_success() -> None:
    b = Breakers(CFG)
    for t in (0.0, 2.0, 4.0):
        b.failure("w", t)
    assert b.tick(8.0) == []
    assert b.tick(9.0) == ["w"] and b.state("w") is State.HALF_OPEN and not b.blocked("w")
    assert b.dispatched("w")  # the probe
    assert b.blocked("w") and not b.dispatched("w")
    assert b.success("w")
    assert b.state("w") is State.CLOSED and not b.blocked("w")


def test_a_probe_that_ends_unanswered_leaves_the_worker_half_open() -> None:
    b = Breakers(CFG)
    for t in (0.0, 2.0, 4.0):
        b.failure("w", t)
    b.tick(9.0)
    assert b.dispatched("w") and b.blocked("w")
    assert b.unanswered("w")  # its request went elsewhere: no verdict
    assert b.state("w") is State.HALF_OPEN and not b.blocked("w")
    assert b.dispatched("w")  # the next request is the probe
    assert b.success("w") and not b.unanswered("w")
    assert b.state("w") is State.CLOSED


def test_a_failed_probe_doubles_the_cooldown_up_to_the_cap() -> None:
    b = Breakers(CFG)
    for t in (0.0, 2.0, 4.0):
        b.failure("w", t)
    b.tick(9.0)
    b.dispatched("w")
    assert b.failure("w", 9.5) and b.cooldown_s("w") == 10.0
    assert b.tick(19.0) == [] and b.tick(19.5) == ["w"]
    b.dispatched("w")
    assert b.failure("w", 20.0) and b.cooldown_s("w") == 12.0


def test_success_on_a_closed_breaker_changes_nothing() -> None:
    b = Breakers(CFG)
    assert not b.success("w")
    b.failure("w", 0.0)
    assert not b.success("w")
    assert b.state("w") is State.CLOSED
