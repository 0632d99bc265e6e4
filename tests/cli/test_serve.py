"""``interlock serve``'s wait for its workers: which start-up failures end it, which are retried."""

from __future__ import annotations

import asyncio
import sys

import pytest

from interlock.cli.procs import Child
from interlock.cli.serve import _wait_ready
from interlock.cli.supervisor import Backoff, RestartPolicy, Supervisor

FAST = Backoff(initial_s=0.05, cap_s=0.1)


class NoWorkersYet:
    """The two calls ``_wait_ready`` makes on the router service, with nobody registering."""

    def instances(self) -> list[object]:
        return []

    async def wait_for_workers(self, count: int, timeout_s: float) -> bool:
        await asyncio.sleep(min(timeout_s, 0.05))
        return False


def wait_with(codes: list[str], policy: RestartPolicy = RestartPolicy.ON_FAILURE,
              timeout_s: float = 1.5) -> bool:
    async def main() -> bool:
        sup = Supervisor(policy, FAST)
        children = [Child(f"worker-{i}", [sys.executable, "-c", code]) for i, code in enumerate(codes)]
        for c in children:
            await c.start()
            sup.watch(c)
        try:
            return await _wait_ready(NoWorkersYet(), len(children), children, sup, asyncio.Event(), timeout_s)
        finally:
            await sup.close()
            await asyncio.gather(*(c.stop(2.0) for c in children))

    return asyncio.run(main())


SLEEP = "import time; time.sleep(30)"


def test_a_config_error_ends_the_wait(capsys: pytest.CaptureFixture[str]) -> None:
    assert not wait_with([SLEEP, "import sys; sys.exit(2)"])
    assert "worker-1 exited with code 2 (a configuration error) before it was ready" in capsys.readouterr().err


def test_every_worker_failing_ends_the_wait(capsys: pytest.CaptureFixture[str]) -> None:
    assert not wait_with(["import sys; sys.exit(3)", "import os; os.kill(os.getpid(), 9)"])
    err = capsys.readouterr().err
    assert "every worker exited before it was ready (worker-0: code 3, worker-1: signal 9 (SIGKILL))" in err


def test_one_worker_failing_is_retried_until_the_timeout(capsys: pytest.CaptureFixture[str]) -> None:
    assert not wait_with([SLEEP, "import sys; sys.exit(3)"], timeout_s=1.0)
    assert "workers not ready after 1s" in capsys.readouterr().err


def test_without_restarts_one_failure_ends_the_wait(capsys: pytest.CaptureFixture[str]) -> None:
    assert not wait_with([SLEEP, "import sys; sys.exit(3)"], RestartPolicy.NEVER)
    assert "worker-1 exited with code 3 before it was ready" in capsys.readouterr().err
