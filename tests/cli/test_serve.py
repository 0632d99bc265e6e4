"""``interlock serve``'s wait for its workers (``RunningCluster.wait_ready``): which start-up
failures end it, which are retried."""

from __future__ import annotations

import asyncio
import sys

from interlock.cluster.builder import RunningCluster, WorkerHandle
from interlock.cluster.procs import Child
from interlock.cluster.spec import ClusterSpec, ProcessOptions
from interlock.cluster.supervisor import Backoff, RestartPolicy, Supervisor

FAST = Backoff(initial_s=0.05, cap_s=0.1)


class NoWorkersYet:
    """The two calls ``wait_ready`` makes on the router service, with nobody registering."""

    def num_workers(self) -> int:
        return 0

    async def wait_for_workers(self, count: int, timeout_s: float) -> bool:
        await asyncio.sleep(min(timeout_s, 0.05))
        return False


def wait_with(
    codes: list[str], policy: RestartPolicy = RestartPolicy.ON_FAILURE, timeout_s: float = 1.5
) -> str | None:
    async def main() -> str | None:
        running = RunningCluster(ClusterSpec(processes=ProcessOptions(restart_policy=policy)))
        running.supervisor = Supervisor(policy, FAST)
        running.service = NoWorkersYet()
        children = [Child(f"worker-{i}", [sys.executable, "-c", code]) for i, code in enumerate(codes)]
        for c in children:
            await c.start()
            running.supervisor.watch(c)
            running._workers[c.name] = WorkerHandle(spec=None, child=c)  # type: ignore[arg-type]
        try:
            return await running.wait_ready(timeout_s=timeout_s)
        finally:
            await running.supervisor.close()
            await asyncio.gather(*(c.stop(2.0) for c in children))

    return asyncio.run(main())


SLEEP = "import time; time.sleep(30)"


def test_a_config_error_ends_the_wait() -> None:
    assert wait_with([SLEEP, "import sys; sys.exit(2)"]) == (
        "worker-1 exited with code 2 (a configuration error) before it was ready"
    )


def test_every_worker_failing_ends_the_wait() -> None:
    why = wait_with(["import sys; sys.exit(3)", "import os; os.kill(os.getpid(), 9)"])
    assert why == "every worker exited before it was ready (worker-0: code 3, worker-1: signal 9 (SIGKILL))"


def test_one_worker_failing_is_retried_until_the_timeout() -> None:
    assert wait_with([SLEEP, "import sys; sys.exit(3)"], timeout_s=1.0) == "workers not ready after 1s"


def test_without_restarts_one_failure_ends_the_wait() -> None:
    assert wait_with([SLEEP, "import sys; sys.exit(3)"], RestartPolicy.NEVER) == (
        "worker-1 exited with code 3 before it was ready"
    )
