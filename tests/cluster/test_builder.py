"""The builder, in one process (in-process planes, mock runner): what it starts serves, the
``metrics`` keys shape ``/metrics`` and the workers' reports, and workers come and go through
``add_worker`` / ``remove_worker`` within ``max_replicas``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from interlock.cluster.builder import RunningCluster, start_cluster
from interlock.cluster.spec import ClusterSpec, ProcessOptions
from interlock.deploy import parse_deployment
from interlock.errors import ConfigError
from interlock.protocol import subjects

MODEL = "SmolLM2-135M-Instruct"


@contextlib.asynccontextmanager
async def running(**sections: Any) -> AsyncIterator[RunningCluster]:
    group = {
        "runner": "mock",
        "max_model_len": 512,
        "nodes": [{"gpu_count": 1, "num_blocks": 64}],
        **sections.pop("group", {}),
    }
    d = parse_deployment({"execution-group": group, "control-plane": {"listen_port": 0}, **sections})
    spec = ClusterSpec(deployment=d, processes=ProcessOptions(in_process=True, drain_grace_s=1.0))
    c = await start_cluster(spec)
    try:
        assert await c.wait_ready(timeout_s=30) is None
        yield c
    finally:
        await c.close()


async def metrics_after_one_request(c: RunningCluster) -> str:
    async with httpx.AsyncClient(base_url=c.server.url, timeout=30) as http:
        r = await http.post(
            "/v1/chat/completions",
            json={"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
        )
        assert r.status_code == 200, r.text
        return (await http.get("/metrics")).text


@pytest.mark.parametrize(
    ("metrics", "shown", "hidden"),
    [
        (
            {},
            (
                "interlock_worker_waiting_requests",
                "interlock_worker_busy_seconds_total",
                "interlock_kv_cache_miss_tokens_total",
                "interlock_time_to_first_token_seconds",
            ),
            (),
        ),
        (
            {"collect_queue_depth": False},
            ("interlock_worker_busy_seconds_total",),
            (
                "interlock_worker_waiting_requests",
                "interlock_worker_running_requests",
                "interlock_router_queued_total",
            ),
        ),
        (
            {"collect_gpu_utilization": False, "collect_kv_cache_miss": False},
            ("interlock_worker_waiting_requests",),
            (
                "interlock_worker_busy_seconds_total",
                "interlock_kv_cache_miss_tokens_total",
                "interlock_prompt_tokens_cached_total",
            ),
        ),
        (
            {"figures": ["ttft"]},
            ("interlock_time_to_first_token_seconds", "interlock_router_decisions_total"),
            ("interlock_inter_token_latency_seconds", "interlock_worker_kv_blocks_used"),
        ),
    ],
)
def test_metrics_keys_switch_families_on_metrics(metrics: dict, shown: tuple, hidden: tuple) -> None:
    async def main() -> str:
        async with running(metrics=metrics) as c:
            return await metrics_after_one_request(c)

    text = asyncio.run(main())
    for name in shown:
        assert f"\n{name}" in text, name
    for name in hidden:
        assert name not in text, name


def test_export_interval_sets_how_often_an_idle_worker_reports() -> None:
    async def reports(interval: str) -> int:
        async with running(metrics={"export_interval": interval}) as c:
            sub = await c.runtime.events.subscribe(subjects.LOAD_ALL)
            seen = 0

            async def count() -> None:
                nonlocal seen
                async for _ in sub:
                    seen += 1

            task = asyncio.create_task(count())
            await asyncio.sleep(1.0)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return seen

    assert asyncio.run(reports("100ms")) >= 4
    assert asyncio.run(reports("30s")) == 0


def test_listen_host_and_port_place_the_frontend() -> None:
    from tests.e2e.conftest import free_port

    port = free_port()

    async def main() -> None:
        async with running(**{"control-plane": {"listen_port": port, "listen_host": "127.0.0.1"}}) as c:
            assert c.server.url == f"http://127.0.0.1:{port}"
            async with httpx.AsyncClient(timeout=10) as http:
                assert (await http.get(f"http://127.0.0.1:{port}/live")).status_code == 200

    asyncio.run(main())


def test_route_key_names_the_header_that_picks_workers() -> None:
    async def main() -> tuple[set[str], set[str]]:
        async with running(
            routing={"route_key": "x-team", "policy": "round-robin"},
            group={"nodes": [{"gpu_count": 4, "num_blocks": 64}]},
        ) as c:
            async with httpx.AsyncClient(base_url=c.server.url, timeout=30) as http:

                async def worker(headers: dict[str, str]) -> str:
                    r = await http.post(
                        "/v1/completions",
                        headers={"x-interlock-explain": "1", **headers},
                        json={"model": MODEL, "max_tokens": 1, "prompt": "hi"},
                    )
                    return r.headers["x-interlock-route"].split(";")[0]

                keyed = {await worker({"x-team": "search"}) for _ in range(8)}
                unkeyed = {await worker({}) for _ in range(8)}
                return keyed, unkeyed

    keyed, unkeyed = asyncio.run(main())
    assert len(keyed) < len(unkeyed) == 4  # one team's requests stay on its subset of workers


def test_workers_are_added_and_removed_within_max_replicas() -> None:
    async def main() -> None:
        async with running(group={"max_replicas": 2}) as c:
            assert [w.role for w in c.workers()] == ["both"]
            added = await c.add_worker("decode")
            assert added.role == "decode" and len(c.workers()) == 2
            assert await c.wait_ready(timeout_s=10) is None
            assert {i.role for i in c.service.instances()} == {"both", "decode"}
            with pytest.raises(ConfigError, match="max_replicas=2"):
                await c.add_worker("both")
            with pytest.raises(ConfigError, match="role: 'gpu' is not one of both, prefill, decode"):
                await c.add_worker("gpu")
            await c.remove_worker(added, drain=True)
            assert [w.role for w in c.workers()] == ["both"]
            for _ in range(500):  # the router sees it leave discovery
                if added.instance_id not in {i.instance_id for i in c.service.instances()}:
                    break
                await asyncio.sleep(0.01)
            assert [i.role for i in c.service.instances()] == ["both"]

    asyncio.run(main())


def test_nats_url_joins_that_server_instead_of_starting_one() -> None:
    from interlock.deploy import ControlPlane, Deployment
    from interlock.runtime import NatsServer

    async def main(url: str) -> None:
        d = Deployment(control_plane=ControlPlane(nats_url=url, listen_port=0), execution_groups=())
        c = await start_cluster(ClusterSpec(deployment=d, start_workers=False))
        try:
            assert c.nats is None and c.url == url and c.server is not None
        finally:
            await c.close()

    with NatsServer() as nats:
        asyncio.run(main(nats.url))
    with pytest.raises(ConfigError, match="control-plane.nats_url is required"):
        asyncio.run(
            start_cluster(ClusterSpec(deployment=Deployment(execution_groups=()), start_workers=False))
        )


def test_set_role_re_roles_a_running_worker() -> None:
    async def main() -> None:
        async with running(group={"nodes": [{"gpu_count": 2, "num_blocks": 64}]}) as c:
            first = c.workers()[0]
            await c.set_role(first, "prefill", grace_s=1.0)
            assert first.role == "prefill"
            for _ in range(500):
                info = c.service.instance(first.instance_id)
                if info is not None and info.role == "prefill":
                    break
                await asyncio.sleep(0.01)
            assert sorted(i.role for i in c.service.instances()) == ["both", "prefill"]
            with pytest.raises(ConfigError, match="role: 'boss' is not one of"):
                await c.set_role(first, "boss")

    asyncio.run(main())


@pytest.mark.slow
def test_a_re_roled_child_worker_keeps_its_role_across_a_restart() -> None:
    import os
    import signal

    async def role_of(c: RunningCluster, wid: str, want: str) -> bool:
        for _ in range(300):
            info = c.service.instance(wid)
            if info is not None and info.role == want:
                return True
            await asyncio.sleep(0.05)
        return False

    async def main() -> None:
        d = parse_deployment(
            {
                "execution-group": {
                    "runner": "mock",
                    "max_model_len": 512,
                    "nodes": [{"gpu_count": 1, "num_blocks": 64}],
                },
                "control-plane": {"listen_port": 0, "heartbeat_interval": 0.25, "heartbeat_timeout": 2.0},
            }
        )
        c = await start_cluster(ClusterSpec(deployment=d, processes=ProcessOptions(drain_grace_s=1.0)))
        try:
            assert await c.wait_ready(timeout_s=120) is None
            [w] = c.workers()
            assert w.child is not None and w.child.pid is not None
            await c.set_role(w, "decode", grace_s=1.0)
            assert await role_of(c, w.instance_id, "decode")
            old, address = w.child.pid, c.service.instance(w.instance_id).address
            os.kill(old, signal.SIGKILL)
            for _ in range(600):  # restarted by the supervisor, registered again (a new address)
                info = c.service.instance(w.instance_id)
                if w.child.pid != old and info is not None and info.address != address:
                    break
                await asyncio.sleep(0.05)
            info = c.service.instance(w.instance_id)
            assert w.child.pid != old and info is not None and info.address != address
            assert info.role == "decode"
        finally:
            await c.close()

    asyncio.run(main())


def test_a_worker_still_starting_is_not_waited_for_at_close() -> None:
    """A worker process that has not registered has nothing to drain: closing the deployment
    gives it ``STARTING_STOP_S``, not the drain grace (a vLLM worker still loading held a
    shutdown for its whole start). Stopped once it catches SIGTERM (its drain handler is set)
    and before it registers (its engine still loading the model), it cannot answer SIGTERM."""
    import os
    import signal

    from interlock.cluster.builder import STARTING_STOP_S

    def catches_sigterm(pid: int) -> bool:
        with open(f"/proc/{pid}/status") as f:
            mask = next(line for line in f if line.startswith("SigCgt:")).split()[1]
        return bool(int(mask, 16) >> (signal.SIGTERM - 1) & 1)

    async def stopped_while_starting() -> bool:
        """One deployment, its worker SIGSTOPped while starting; False (closed, nothing
        checked) where the worker registered first (a busy machine may let it)."""
        d = parse_deployment(
            {
                "execution-group": {"max_model_len": 512, "nodes": [{"gpu_count": 1, "num_blocks": 64}]},
                "control-plane": {"listen_port": 0},
            }
        )
        c = await start_cluster(ClusterSpec(deployment=d, processes=ProcessOptions(drain_grace_s=120.0)))
        [w] = c.workers()
        assert w.child is not None and w.child.pid is not None
        for _ in range(30_000):  # its imports: seconds on two cores
            if catches_sigterm(w.child.pid):
                break
            await asyncio.sleep(0.002)
        os.kill(w.child.pid, signal.SIGSTOP)
        try:
            assert catches_sigterm(w.child.pid)
            await asyncio.sleep(0.5)  # a registration already on its way arrives
            if c.service.instance(w.instance_id) is not None:
                os.kill(w.child.pid, signal.SIGCONT)
                await c.close()
                return False
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            await asyncio.wait_for(c.close(), 60)  # with the drain grace it would take 125 s
            assert loop.time() - t0 < STARTING_STOP_S + 30
            assert w.child.process is not None and w.child.process.returncode == -signal.SIGKILL
            return True
        finally:
            if w.child.alive:
                os.kill(w.child.pid, signal.SIGKILL)

    async def main() -> None:
        for _ in range(3):
            if await stopped_while_starting():
                return
        raise AssertionError("the worker registered before it could be stopped, three times")

    asyncio.run(main())
