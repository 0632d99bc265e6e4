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

from interlock.protocol.control import ControlReply, ControlRequest
from interlock.router.disagg import DisaggConfig
from interlock.router.disagg_flow import control_call
from interlock.router.facade import RouterConfig
from interlock.router.service import RouterService
from interlock.runtime import NatsServer, RuntimeConfig, connect_runtime
from interlock.runtime.runtime import Runtime

ROOT = Path(__file__).resolve().parents[2]
FAST = RuntimeConfig(heartbeat_interval=0.2, lease_timeout=1.0, connect_timeout=2.0, peer_timeout=2.0)


@dataclass
class ProcCluster:
    nats: NatsServer
    runtime: Runtime
    service: RouterService
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def spawn(self, wid: str, role: str, *args: str) -> None:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "INTERLOCK_LOG_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1"}
        argv = [sys.executable, "-m", "interlock.cli.main", "worker", "--nats-url", self.nats.url,
                "--instance-id", wid, "--role", role, "--heartbeat-interval", "0.2",
                "--heartbeat-timeout", "1.0", "--drain-grace", "2", *args]
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
async def proc_cluster(config: DisaggConfig, *, block_size: int) -> AsyncIterator[ProcCluster]:
    with NatsServer() as nats:
        runtime = await connect_runtime(nats.url, FAST)
        service = RouterService(discovery=runtime.discovery, requests=runtime.requests,
                                events=runtime.events, config=RouterConfig(block_size=block_size),
                                disagg=config)
        await service.start()
        c = ProcCluster(nats, runtime, service)
        try:
            yield c
        finally:
            await asyncio.to_thread(c.stop_all)
            await service.close()
            await runtime.close()
