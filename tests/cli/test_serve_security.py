"""``interlock serve --runner mock`` with its planes authenticated: it serves end to end, before
and after its nats-server is SIGKILLed and restarted, while a process without the generated
credentials gets nowhere, and no secret shows on any command line."""

from __future__ import annotations

import asyncio
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import nats
import pytest

from interlock.errors import TransportError
from interlock.protocol import subjects
from interlock.runtime import NatsAuth, RuntimeConfig, connect_runtime
from interlock.runtime.tcp import TcpRequestPlane
from tests.cli.test_serve_restarts import MOCK, MODEL, children, log, wait_until
from tests.e2e.conftest import Served, start_serve

pytestmark = pytest.mark.slow


@pytest.fixture
def served() -> Iterator[Served]:
    s = start_serve(*MOCK, timeout_s=120)
    yield s
    s.stop()


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def _chat(served: Served, i: int) -> httpx.Response:
    return httpx.post(
        served.base_url + "/chat/completions",
        timeout=30,
        json={"model": MODEL, "messages": [{"role": "user", "content": f"Hi {i}"}], "max_tokens": 3},
    )


def test_serve_with_authenticated_planes(served: Served) -> None:
    nats_url = re.search(r"nats (nats://[\d.:]+)\)", log(served)).group(1)  # type: ignore[union-attr]
    workers = children(served, b"worker")
    env = _environ(workers[0])
    secret, password = env["INTERLOCK_CLUSTER_SECRET"], env["INTERLOCK_NATS_PASSWORD"]
    assert len(secret) >= 32 and len(password) >= 32
    for pid in [*workers, *children(served, b"nats-server"), served.process.pid]:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes()
        assert secret.encode() not in argv and password.encode() not in argv
    assert all(_chat(served, i).status_code == 200 for i in range(3))

    async def attacks() -> None:
        with pytest.raises(Exception, match="(?i)authorization|no servers"):
            await nats.connect(nats_url, allow_reconnect=False, max_reconnect_attempts=1, connect_timeout=1)
        auth = NatsAuth(user=env["INTERLOCK_NATS_USER"], password=password)
        insider = await connect_runtime(nats_url, RuntimeConfig(nats_auth=auth))  # NATS only, no secret
        try:
            infos = await insider.discovery.instances(subjects.GENERATE_ENDPOINT)
            assert len(infos) == 2
            outsider = TcpRequestPlane(RuntimeConfig())
            with pytest.raises(TransportError):
                await outsider.ping(infos[0].address)
            await outsider.close()
            member = TcpRequestPlane(RuntimeConfig(cluster_secret=secret.encode()))
            assert await member.ping(infos[0].address) > 0
            await member.close()
        finally:
            await insider.close()

    asyncio.run(attacks())

    [nats_pid] = children(served, b"nats-server")
    os.kill(nats_pid, signal.SIGKILL)
    assert wait_until(lambda: "nats-server restarted (pid" in log(served), 15), log(served)[-3000:]
    assert wait_until(lambda: _chat(served, 9).status_code == 200, 20), log(served)[-3000:]
    assert all(_chat(served, i).status_code == 200 for i in range(3))

    async def rejoined() -> int:  # the workers logged in again and re-announced themselves
        auth = NatsAuth(user=env["INTERLOCK_NATS_USER"], password=password)
        rt = await connect_runtime(nats_url, RuntimeConfig(nats_auth=auth, discovery_sync_s=0.5))
        try:
            return len(await rt.discovery.instances(subjects.GENERATE_ENDPOINT))
        finally:
            await rt.close()

    assert wait_until(lambda: asyncio.run(rejoined()) == 2, 10)
    assert served.process.poll() is None
