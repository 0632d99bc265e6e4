"""Worker processes (``interlock worker``) over a private nats-server, and a router in the test
process: the multi-process disaggregated deployment the shm/TCP tests need."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from interlock.cluster.builder import RunningCluster, start_cluster
from interlock.cluster.spec import ClusterSpec
from interlock.deploy import ControlPlane, Deployment, Routing
from interlock.protocol.control import ControlReply, ControlRequest
from interlock.router.service import RouterService
from interlock.router.worker_control import control_call
from interlock.runtime import NatsServer
from interlock.runtime.runtime import Runtime

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class ProcCluster:
    nats: NatsServer
    running: RunningCluster
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def runtime(self) -> Runtime:
        return self.running.runtime  # type: ignore[no-any-return]

    @property
    def service(self) -> RouterService:
        return self.running.service  # type: ignore[no-any-return]

    def spawn(self, wid: str, role: str, *args: str) -> None:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "INTERLOCK_LOG_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1"}
        argv = [
            sys.executable,
            "-m",
            "interlock.cli.main",
            "worker",
            "--nats-url",
            self.nats.url,
            "--instance-id",
            wid,
            "--role",
            role,
            "--heartbeat-interval",
            "0.2",
            "--heartbeat-timeout",
            "1.0",
            "--drain-grace",
            "2",
            *args,
        ]
        self.procs[wid] = subprocess.Popen(argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL)

    async def wait_for(self, n: int, timeout_s: float = 120.0) -> None:
        have = await self.service.wait_for_workers(n, timeout_s)
        assert have >= n, f"only {have} of {n} workers joined"

    def kill(self, wid: str) -> None:
        proc = self.procs.pop(wid)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    async def control(self, wid: str, req: ControlRequest) -> ControlReply:
        info = self.service.instance(wid)
        return await control_call(self.runtime.requests, info.metadata["control_address"], req)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self.procs.clear()


@contextlib.asynccontextmanager
async def proc_cluster(routing: Routing) -> AsyncIterator[ProcCluster]:
    """A router built as ``interlock frontend`` builds it (no HTTP), on a private nats-server."""
    with NatsServer() as nats:
        cp = ControlPlane(nats_url=nats.url, heartbeat_interval=0.2, heartbeat_timeout=1.0)
        spec = ClusterSpec(
            deployment=Deployment(control_plane=cp, routing=routing, execution_groups=()),
            frontend=None,
            start_workers=False,
        )
        c = ProcCluster(nats, await start_cluster(spec))
        try:
            yield c
        finally:
            await asyncio.to_thread(c.stop_all)
            await c.running.close()
