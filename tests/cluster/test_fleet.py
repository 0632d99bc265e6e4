"""The planner's ``Fleet`` over a running deployment (one process: in-process planes, mock
runner): it lists the workers as the router sees them, starts, drains and re-roles them; and
``start_planner`` runs a planner over it with its status served."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import httpx
import pytest

from interlock.cluster.builder import RunningCluster, start_cluster
from interlock.cluster.fleet import ClusterFleet
from interlock.cluster.spec import ClusterSpec, ProcessOptions, fleet_planner_config
from interlock.deploy import parse_deployment
from interlock.errors import ConfigError
from interlock.planner import PlannerConfig, RoleBounds
from interlock.protocol import GenerateRequest, SamplingParams
from interlock.protocol.routing import RequestContext


def spec(
    group: dict[str, Any] | None = None, routing: dict[str, Any] | None = None, **changes: Any
) -> ClusterSpec:
    g = {
        "runner": "mock",
        "max_model_len": 512,
        "nodes": [{"gpu_count": 1, "num_blocks": 64}],
        **(group or {}),
    }
    d = parse_deployment(
        {"execution-group": g, "control-plane": {"listen_port": 0}, "routing": routing or {}}
    )
    return ClusterSpec(deployment=d, processes=ProcessOptions(in_process=True, drain_grace_s=1.0), **changes)


@contextlib.asynccontextmanager
async def running(s: ClusterSpec) -> AsyncIterator[RunningCluster]:
    c = await start_cluster(s)
    try:
        assert await c.wait_ready(timeout_s=30) is None
        yield c
    finally:
        await c.close()


async def until(check: Any, timeout_s: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


def test_fleet_adds_drains_and_reroles_real_workers() -> None:
    async def main() -> None:
        async with running(spec()) as c:
            fleet = ClusterFleet(c, role_grace_s=1.0)
            (first,) = await fleet.workers()
            assert first.ready and not first.draining and first.role == "both"
            wid = await fleet.add_worker("both")
            assert {w.worker_id for w in await fleet.workers()} == {first.worker_id, wid}

            async def both_ready() -> bool:
                return all(w.ready for w in await fleet.workers())

            await until(both_ready)
            await fleet.remove_worker(first.worker_id)
            listed = {w.worker_id: w for w in await fleet.workers()}
            assert listed[first.worker_id].draining  # listed until it has stopped

            async def gone() -> bool:
                return [w.worker_id for w in await fleet.workers()] == [wid]

            await until(gone)
            assert c.service.instance(first.worker_id) is None
            with pytest.raises(ConfigError, match="not one of this deployment's running workers"):
                await fleet.remove_worker(first.worker_id)
            await fleet.close()

    asyncio.run(main())


def test_scaling_down_lets_the_worker_finish_its_streams() -> None:
    """The planner's removal is a drain: the worker leaves the router at once, but a stream it
    is serving finishes on it (no migration), and it stops once that is done."""

    async def main() -> None:
        s = replace(spec(), processes=ProcessOptions(in_process=True, drain_grace_s=30.0))
        async with running(s) as c:
            fleet = ClusterFleet(c)
            (first,) = await fleet.workers()
            [handle] = c.workers()
            other = await fleet.add_worker("both")

            async def both_ready() -> bool:
                return all(w.ready for w in await fleet.workers())

            await until(both_ready)
            req = GenerateRequest(
                request_id="long",
                token_ids=tuple(range(10, 40)),
                model=handle.spec.served_name,
                sampling=SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True),
            )
            ctx = RequestContext(request_id="long", endpoint="completions", worker_id=first.worker_id)
            got: list[int] = []
            finish = None
            async with contextlib.aclosing(c.service.generate(req, ctx)) as stream:
                async for out in stream:
                    got += out.token_ids
                    finish = out.finish_reason
                    if len(got) >= 5 and c.service.instance(handle.instance_id) is not None:
                        await fleet.remove_worker(first.worker_id)

                        async def left() -> bool:
                            return c.service.instance(handle.instance_id) is None

                        await until(left)
                        assert handle.local.in_flight == 1  # still streaming, on the drained worker
            assert len(got) == 200 and finish == "length"
            m = c.service.dispatcher.metrics
            assert (m.migrations, m.worker_aborts, m.retries) == (0, 0, 0)

            async def gone() -> bool:
                return [w.worker_id for w in await fleet.workers()] == [other]

            await until(gone)
            await fleet.close()

    asyncio.run(main())


def test_fleet_set_role_re_roles_a_running_worker() -> None:
    async def main() -> None:
        async with running(
            spec(
                group={
                    "nodes": [
                        {"node_role": "prefill", "gpu_count": 1},
                        {"node_role": "decode", "gpu_count": 1},
                    ]
                }
            )
        ) as c:
            fleet = ClusterFleet(c, role_grace_s=1.0)
            prefill = next(w for w in await fleet.workers() if w.role == "prefill")
            await fleet.set_role(prefill.worker_id, "decode")

            async def re_registered() -> bool:
                info = c.service.instance(prefill.worker_id)
                return info is not None and info.role == "decode"

            await until(re_registered)
            assert sorted(w.role for w in await fleet.workers()) == ["decode", "decode"]

    asyncio.run(main())


def test_start_planner_serves_its_status_and_grows_within_max_replicas() -> None:
    cfg = PlannerConfig(both=RoleBounds(2, 8), interval_s=0.05, window_s=0.2, ramp_s=0.0)
    s = spec(group={"max_replicas": 2}, planner=cfg, planner_port=0)
    assert fleet_planner_config(s).total_max() == 2  # the group's cap bounds the planner too

    async def main() -> dict[str, Any]:
        async with running(s) as c:
            await c.start_planner()
            assert c.planner_url is not None

            async def grown() -> bool:
                return len(c.workers()) == 2 and len(c.service.instances()) == 2

            await until(grown)
            async with httpx.AsyncClient(timeout=5) as http:
                status: dict[str, Any] = (await http.get(c.planner_url + "/planner")).json()
            return status

    status = asyncio.run(main())
    assert status["policy"] == "reactive" and status["errors"] == 0
    assert [d["kind"] for d in status["decisions"]] == ["add"]  # up to min 2, then no further


def test_a_busy_planner_port_is_a_clear_error() -> None:
    async def main() -> None:
        taken = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = taken.sockets[0].getsockname()[1]
        try:
            async with running(spec(planner=PlannerConfig(), planner_port=port)) as c:
                with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{port}"):
                    await c.start_planner()
                assert c.planner is None
        finally:
            taken.close()

    asyncio.run(main())


def test_a_planner_with_cache_blind_routing_runs_without_a_ramp() -> None:
    """No ramp by default (``ramp_s`` 0): round-robin, which has no weights, takes a planner."""
    assert spec(routing={"policy": "round-robin"}, planner=PlannerConfig()) is not None


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"routing": {"policy": "round-robin"}, "planner": PlannerConfig(ramp_s=60.0)},
            "has no routing weights",
        ),
        (
            {
                "group": {
                    "nodes": [
                        {"node_role": "prefill", "gpu_count": 1},
                        {"node_role": "decode", "gpu_count": 1},
                    ]
                },
                "planner": PlannerConfig(),
            },
            "planner.decode: the deployment starts decode workers",
        ),
        ({"group": {"max_replicas": 1}, "planner": PlannerConfig(both=RoleBounds(2, 4))}, "max_replicas=1"),
        ({"planner": PlannerConfig(), "start_workers": False}, "needs the router and the workers"),
    ],
)
def test_a_planner_the_deployment_cannot_run_is_refused_by_name(
    changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        spec(**changes)
