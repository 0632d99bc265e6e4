"""``interlock serve``'s wait for its workers (``RunningCluster.wait_ready``): which start-up
failures end it, which are retried; and where its placement (this host's room) comes from."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from interlock.cli.serve import build_parser, spec_from_args
from interlock.cluster.builder import RunningCluster, WorkerHandle
from interlock.cluster.procs import Child
from interlock.cluster.spec import ClusterSpec, PlacementConfig, ProcessOptions
from interlock.cluster.supervisor import Backoff, RestartPolicy, Supervisor
from interlock.errors import ConfigError

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
            return await running.wait_ready(len(codes), timeout_s=timeout_s)
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


def test_the_files_placement_section_and_the_flags_over_it(tmp_path: Path) -> None:
    f = tmp_path / "d.yaml"
    f.write_text(
        "execution-group: {runner: mock, nodes: [{gpu_count: 1}]}\nplacement: {cores: 2, headroom-cores: 0.5}\n"
    )
    s = spec_from_args(build_parser().parse_args(["-f", str(f), "--host-memory-gib", "4"]))
    assert s.placement == PlacementConfig(cores=2, memory_gib=4, headroom_cores=0.5)
    s = spec_from_args(build_parser().parse_args(["--runner", "mock", "--headroom-cores", "1"]))
    assert s.placement == PlacementConfig(headroom_cores=1)
    f.write_text("execution-group: {runner: mock}\nplacement: {cpus: 2}\n")
    with pytest.raises(ConfigError, match=r"d.yaml: placement.cpus: unknown key \(known: cores, devices"):
        spec_from_args(build_parser().parse_args(["-f", str(f)]))
