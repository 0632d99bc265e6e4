"""A worker in its own process, serving over NATS (+TCP), killed with SIGKILL mid-stream.

It must leave discovery within the lease timeout, and the client streaming from it must get a
TransportError rather than hang.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import aclosing
from dataclasses import replace
from pathlib import Path

import anyio
import pytest

from interlock.errors import TransportError
from interlock.runtime import NatsServer, connect_runtime

from .conftest import FAST

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[2]
StartWorker = Callable[[str, str], "subprocess.Popen[str]"]


@pytest.fixture
def start_worker(nats_server: NatsServer) -> Iterator[StartWorker]:
    processes: list[subprocess.Popen[str]] = []

    def start(namespace: str, request_plane: str) -> subprocess.Popen[str]:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        args = [
            sys.executable,
            "-m",
            "tests.runtime.worker_process",
            nats_server.url,
            namespace,
            request_plane,
        ]
        process = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
        processes.append(process)
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        return process

    yield start
    for process in processes:
        process.kill()
        process.wait(timeout=10)


@pytest.mark.parametrize("request_plane", ["tcp", "nats"])
async def test_killed_worker_leaves_discovery_and_fails_its_stream(
    nats_server: NatsServer, start_worker: StartWorker, namespace: str, request_plane: str
) -> None:
    worker = start_worker(namespace, request_plane)
    config = replace(FAST, request_plane=request_plane)  # type: ignore[arg-type]
    async with await connect_runtime(nats_server.url, config) as client:
        endpoint = f"{namespace}.worker.generate"
        [instance] = await client.discovery.instances(endpoint)
        removed_at: list[float] = []

        async def watch_for_removal() -> None:
            async with aclosing(client.discovery.watch(endpoint)) as events:
                async for event in events:
                    if event.kind == "removed" and event.instance.instance_id == "w1":
                        removed_at.append(time.monotonic())
                        return

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(watch_for_removal)
            async with aclosing(client.requests.stream(instance.address, b"")) as chunks:
                assert await anext(chunks) == b"tok"
                os.kill(worker.pid, signal.SIGKILL)
                killed = time.monotonic()
                with anyio.fail_after(FAST.peer_timeout * 2), pytest.raises(TransportError):
                    async for _ in chunks:
                        pass
            with anyio.fail_after(FAST.lease_timeout * 2):
                while not removed_at:
                    await anyio.sleep(0.01)
        assert removed_at[0] - killed <= FAST.lease_timeout + 0.5  # slack for a busy 2-core box
        assert await client.discovery.instances(endpoint) == []
