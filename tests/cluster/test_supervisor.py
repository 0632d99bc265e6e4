"""The restart decisions (plain calls, explicit times) and the async shell with tiny real processes."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Callable

import pytest

from interlock.cluster.procs import Child
from interlock.cluster.supervisor import (
    Backoff,
    Exit,
    History,
    Leave,
    Left,
    Restart,
    RestartPolicy,
    Running,
    Supervisor,
    Waiting,
    describe_exit,
    on_exit,
    problem,
    startup_failure,
)

ON_FAILURE = RestartPolicy.ON_FAILURE
B = Backoff()  # 0.5 s doubling to 30 s; stable after 60 s; 5 failures in 60 s is a crash loop


def quick_failures(
    times: list[float], code: int = -9, policy: RestartPolicy = ON_FAILURE, backoff: Backoff = B
) -> tuple[History, list[Restart | Leave]]:
    h, decisions = History(), []
    for t in times:
        h, d = on_exit(h, Exit(code, at=t, uptime_s=0.1), policy, backoff)
        decisions.append(d)
    return h, decisions


def test_delay_doubles_from_half_a_second_to_the_cap() -> None:
    _, ds = quick_failures([float(i) for i in range(9)], backoff=Backoff(loop_window_s=0.5))
    assert [d.delay_s for d in ds if isinstance(d, Restart)] == [0.5, 1, 2, 4, 8, 16, 30, 30, 30]
    assert [d.attempt for d in ds if isinstance(d, Restart)] == list(range(1, 10))


def test_a_stable_run_resets_the_delay() -> None:
    h, _ = quick_failures([0.0, 1.0, 3.0, 7.0])  # next would be 8 s
    h, d = on_exit(h, Exit(-9, at=100.0, uptime_s=60.0), ON_FAILURE, B)
    assert d == Restart(delay_s=0.5, attempt=1, crash_loop=False)
    h, d = on_exit(h, Exit(-9, at=101.0, uptime_s=0.5), ON_FAILURE, B)
    assert d == Restart(delay_s=1.0, attempt=2, crash_loop=False)


def test_five_failures_within_the_window_is_a_crash_loop_still_retried() -> None:
    h, ds = quick_failures([0.0, 1.0, 3.0, 7.0, 15.0, 31.0])
    assert [isinstance(d, Restart) and d.crash_loop for d in ds] == [False] * 4 + [True, True]
    assert ds[-1] == Restart(delay_s=16.0, attempt=6, crash_loop=True)
    assert h.total_failures == 6 and h.failures == (0.0, 1.0, 3.0, 7.0, 15.0, 31.0)


def test_failures_outside_the_window_do_not_count() -> None:
    h, ds = quick_failures([0.0, 20.0, 40.0, 60.0, 80.0, 100.0])
    assert not any(isinstance(d, Restart) and d.crash_loop for d in ds)
    assert h.failures == (60.0, 80.0, 100.0)


def test_an_unasked_clean_exit_is_restarted_too() -> None:
    """A worker drained by a SIGTERM from outside exits 0: the fleet is still a worker short."""
    h, d = on_exit(History(), Exit(0, at=5.0, uptime_s=5.0), ON_FAILURE, B)
    assert d == Restart(delay_s=B.initial_s, attempt=1, crash_loop=False)
    assert h.total_failures == 1
    h, d = on_exit(History(), Exit(0, at=5.0, uptime_s=5.0), RestartPolicy.NEVER, B)
    assert d == Leave("exited with code 0 and is not restarted (--restart-policy never)")


def test_never_policy_leaves_a_failed_process_down() -> None:
    h, d = on_exit(History(), Exit(3, at=5.0, uptime_s=5.0), RestartPolicy.NEVER, B)
    assert d == Leave("exited with code 3 and is not restarted (--restart-policy never)")
    assert h.total_failures == 1


def test_exits_are_described_by_code_or_signal() -> None:
    assert describe_exit(3) == "code 3"
    assert describe_exit(-9) == "signal 9 (SIGKILL)"
    assert describe_exit(None) == "failed to start"


def test_problem_lines() -> None:
    h, _ = quick_failures([0.0, 1.0, 3.0])
    assert problem("worker-1", Running(since=3.5), h, 4.0, B) is None
    assert (
        problem("worker-1", Waiting(until=7.0), h, 3.0, B)
        == "worker-1 is down (signal 9 (SIGKILL)), restarting in 4.0 s"
    )
    h, _ = quick_failures([0.0, 1.0, 3.0, 7.0, 15.0])
    looping = "worker-1 is crash looping: exited 5 times in 60 s (last: signal 9 (SIGKILL))"
    assert problem("worker-1", Waiting(until=31.0), h, 15.0, B) == looping + "; restarting in 16.0 s"
    assert problem("worker-1", Running(since=31.0), h, 32.0, B) == looping
    assert problem("worker-1", Running(since=31.0), h, 61.0, B) is None  # the first failure aged out
    assert (
        problem("worker-1", Left("exited with code 0 and is not restarted"), h, 1.0, B)
        == "worker-1 exited with code 0 and is not restarted"
    )


def test_startup_gives_up_on_a_config_error_or_when_every_worker_failed() -> None:
    failed, _ = quick_failures([1.0])
    config, _ = quick_failures([1.0], code=2)
    assert startup_failure({"worker-0": History(), "worker-1": failed}) is None
    assert (
        startup_failure({"worker-0": failed, "worker-1": failed})
        == "every worker exited before it was ready (worker-0: signal 9 (SIGKILL), worker-1: signal 9 (SIGKILL))"
    )
    assert (
        startup_failure({"worker-0": History(), "worker-1": config})
        == "worker-1 exited with code 2 (a configuration error) before it was ready"
    )
    assert (
        startup_failure({"worker-0": History(), "worker-1": failed}, RestartPolicy.NEVER)
        == "worker-1 exited with signal 9 (SIGKILL) before it was ready"
    )


FAST = Backoff(initial_s=0.1, factor=2.0, cap_s=0.4, loop_window_s=10.0, loop_exits=3)


def py(name: str, code: str) -> Child:
    return Child(name, [sys.executable, "-c", code])


async def until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


def test_shell_restarts_a_killed_process_and_reports_a_crash_loop(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="interlock.supervisor")

    async def main() -> None:
        sup = Supervisor(ON_FAILURE, FAST)
        sleeper = py("sleeper", "import time; time.sleep(60)")
        failing = py("failing", "import sys; sys.exit(3)")
        for c in (sleeper, failing):
            await c.start()
            sup.watch(c)
        try:
            first = sleeper.pid
            assert sleeper.process is not None
            sleeper.process.send_signal(signal.SIGKILL)
            await until(lambda: sleeper.alive and sleeper.pid != first)
            await until(lambda: sup.history("failing").total_failures >= 3)
            [line] = sup.problems()  # the sleeper is back up: only the failing one is a problem
            assert line.startswith("failing is crash looping: exited ")
            assert "times in 10 s (last: code 3)" in line
            assert sup.history("sleeper").total_failures == 1
        finally:
            await sup.close()
            await asyncio.gather(sleeper.stop(2.0), failing.stop(2.0))
        assert not sleeper.alive and sup.history("sleeper").total_failures == 1  # our stop: no restart

    asyncio.run(main())
    text = caplog.text
    assert "sleeper exited with signal 9 (SIGKILL); restart 1 in 0.1 s" in text
    assert "sleeper restarted (pid" in text
    assert "failing is crash looping: exited 3 times in 10 s (last: code 3); restart 3 in 0.4 s" in text


def test_shell_never_policy_and_clean_exit() -> None:
    async def main() -> None:
        sup = Supervisor(RestartPolicy.NEVER, FAST)
        failing, clean = py("failing", "import sys; sys.exit(3)"), py("clean", "pass")
        for c in (failing, clean):
            await c.start()
            sup.watch(c)
        await until(lambda: len(sup.problems()) == 2)
        await asyncio.sleep(0.2)
        assert sup.problems() == [
            "failing exited with code 3 and is not restarted (--restart-policy never)",
            "clean exited with code 0 and is not restarted (--restart-policy never)",
        ]
        assert sup.history("failing").total_failures == 1
        await sup.close()

    asyncio.run(main())
