"""A planner over a serving instance of the Python API (``create_serving_instance(planner=...)``):
real nats-server (``Cluster.local``), worker processes with the mock runner, a stepped load
through the API (low, high, low). The instance grows by one worker under load and shrinks back
after; the decisions read back through ``planner_status()``; bad arguments are refused by name
before any worker starts; closing stops the planner and every worker."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import interlock
from interlock.errors import ConfigError
from interlock.planner import PlannerConfig, RoleBounds

PLANNER = {"policy": "reactive", "interval_s": 0.1, "window_s": 1.0, "ramp_s": 0.5}


@pytest.fixture(scope="module")
def cluster() -> Iterator[interlock.Cluster]:
    with interlock.Cluster.local(heartbeat_interval=0.5) as c:
        c.register_model("m", "smollm2", runner="mock", max_model_len=512, speedup=2.0)
        yield c


def wait_for(check: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def kinds(instance: interlock.ServingInstance) -> list[str]:
    return [d["kind"] for d in instance.planner_status()["decisions"]]


async def load(instance: interlock.ServingInstance, clients: int, until: Callable[[], bool]) -> int:
    """``clients`` concurrent requests, each followed by the next, until ``until()``; how many
    finished (each with all its tokens)."""
    done = 0

    async def client() -> None:
        nonlocal done
        while not until():
            text = await instance.agenerate([5, 6, 7, 8], max_tokens=24, temperature=0, ignore_eos=True)
            assert text is not None
            done += 1

    await asyncio.gather(*(client() for _ in range(clients)))
    return done


def test_a_planner_grows_the_instance_under_load_and_shrinks_it_after(cluster: interlock.Cluster) -> None:
    instance = cluster.create_serving_instance(
        model="m",
        min_replicas=1,
        max_replicas=2,
        planner=PLANNER,
        planner_port=0,
        num_blocks=256,
        max_num_seqs=2,
    )
    try:
        assert len(instance.workers) == 1
        with pytest.raises(ConfigError, match="scale_to: a planner sizes the serving instance of 'm'"):
            instance.scale_to(2)
        # high: about ten requests wait at one worker of two slots (the reactive threshold is 2)
        deadline = time.monotonic() + 20.0
        added = lambda: kinds(instance) == ["add"] or time.monotonic() > deadline  # noqa: E731
        assert asyncio.run(load(instance, 12, added)) > 0
        assert kinds(instance) == ["add"]
        wait_for(lambda: len(instance.workers) == 2)
        # low: nothing waits; after the window the planner removes the worker it added
        wait_for(lambda: kinds(instance) == ["add", "remove"], 30.0)
        wait_for(lambda: len(instance.workers) == 1)
        status = instance.planner_status()
        assert status["policy"] == "reactive" and status["errors"] == 0
        assert status["decisions_total"] == {"add": 1, "remove": 1}
        add, remove = status["decisions"]
        assert "queue" in add["reason"] and add["role"] == "both"
        assert remove["worker_id"] != instance.workers[0].instance_id
        assert instance.generate([5, 6, 7], max_tokens=3, temperature=0) is not None
        # the same status over HTTP, as `interlock planner status` reads it
        assert instance.planner_url is not None
        with urllib.request.urlopen(f"{instance.planner_url}/planner", timeout=10) as r:
            served = json.load(r)
        assert served["decisions"] == status["decisions"] and served["policy"] == "reactive"
        with urllib.request.urlopen(f"{instance.planner_url}/metrics", timeout=10) as r:
            assert 'interlock_planner_decisions_total{kind="add"} 1' in r.read().decode()
    finally:
        planned = instance._planner
        instance.close()
    assert instance.workers == [] and planned is not None and planned.task.done()
    assert instance.planner_url is None and planned.server is not None and not planned.server.is_serving()
    assert planned not in cluster.running._planners
    with pytest.raises(ConfigError, match="has no planner"):
        instance.planner_status()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"planner": {"policy": "reactive", "colour": 1}}, "planner.colour: unknown key"),
        ({"planner": "fast"}, "planner.policy: 'fast' is not one of"),
        ({"planner": "sla"}, "planner.policy 'sla' needs planner.profile"),
        (
            {"planner": {"policy": "sla", "profile": "/nonexistent/p.json"}, "max_replicas": 2},
            "capability profile /nonexistent/p.json",
        ),
        ({"planner": 3}, "planner: expected a policy name, a mapping or a PlannerConfig, got int"),
        ({"planner_port": 0}, "planner_port: serves a planner's status"),
        ({"planner": "reactive", "max_replicas": 2, "planner_port": 70000}, "planner_port: 70000 is not"),
        ({"planner": "reactive"}, "planner: nothing to scale: max_replicas=1"),
        ({"planner": {"interval_s": 0}}, "planner.interval_s must be positive"),
        (
            {"planner": PlannerConfig(both=RoleBounds(3, 4)), "max_replicas": 2},
            "planner: its minimum workers exceed execution-group.max_replicas=2",
        ),
        (
            {"planner": {"both": {"min": 1, "max": 0}}, "max_replicas": 2},
            "role bounds need 0 <= min <= max",
        ),
        (
            {"planner": {"decode": {"min": 0, "max": 2}, "both": {"min": 0, "max": 0}}, "max_replicas": 2},
            "planner.both: the deployment starts both workers but the planner's both max is 0",
        ),
    ],
)
def test_bad_planner_arguments_are_refused_by_name_before_any_worker_starts(
    cluster: interlock.Cluster, kwargs: dict[str, Any], message: str
) -> None:
    before = len(cluster.running.workers())
    with pytest.raises(ConfigError, match=message):
        cluster.create_serving_instance(model="m", **kwargs)
    assert len(cluster.running.workers()) == before


def test_a_planner_scales_its_own_instance_and_stops_with_the_cluster() -> None:
    """Two instances (two execution groups): the planner of the second sees only its own
    workers and its model's router; closing the cluster stops it, then every worker."""
    with interlock.Cluster.local() as c:
        c.register_model("a", "smollm2", runner="mock", max_model_len=512)
        c.register_model("m", "smollm2", runner="mock", max_model_len=512)
        fixed = c.create_serving_instance(model="a", num_blocks=64)
        instance = c.create_serving_instance(
            model="m", max_replicas=2, planner={"interval_s": 0.1, "ramp_s": 0}, num_blocks=64
        )
        planned = instance._planner
        assert planned is not None and not planned.task.done()
        assert instance.planner_url is None  # no planner_port: not served
        assert (fixed.group, instance.group, planned.fleet.group) == (0, 1, 1)
        assert planned.loop.view.model == "m"
        [mine] = c.call(planned.fleet.workers())
        assert mine.worker_id == instance.workers[0].instance_id
        with pytest.raises(ConfigError, match="serving instance of 'a' has no planner"):
            fixed.planner_status()
        wait_for(lambda: instance.planner_status()["ticks"] >= 2)
        assert instance.planner_status()["decisions"] == []  # idle: within its bounds, no change
        children = [h.child for h in c.running.workers() if h.child is not None]
        assert len(children) == 2
    assert planned.task.done() and not c.running._planners
    assert all(not child.alive for child in children)
    assert c.running.nats is not None and c.running.nats.returncode is not None


def test_scale_to_returns_once_the_new_workers_serve_and_the_removed_are_gone(
    cluster: interlock.Cluster,
) -> None:
    instance = cluster.create_serving_instance(model="m", max_replicas=3, num_blocks=64)
    service = cluster.running.service
    try:
        instance.scale_to(2)
        assert len(instance.workers) == 2
        assert all(service.instance(h.instance_id) is not None for h in instance.workers)
        assert cluster.running.startup_s(instance.group) > 0  # launch to registered, measured
        gone = instance.workers[-1].instance_id
        instance.scale_to(1)
        assert service.instance(gone) is None
        with pytest.raises(
            ConfigError, match=r"scale to 2 workers of 'm': worker w\d+-\w+ did not serve within"
        ):
            instance.scale_to(2, timeout_s=0.001)  # named, not silently returned
    finally:
        instance.close()


def test_min_replicas_zero_starts_no_worker_and_needs_a_planner(cluster: interlock.Cluster) -> None:
    with pytest.raises(ConfigError, match="min_replicas: 0 starts no worker; give a planner"):
        cluster.create_serving_instance(model="m", min_replicas=0, max_replicas=2)
    instance = cluster.create_serving_instance(
        model="m", min_replicas=0, max_replicas=2, planner={"interval_s": 0.1, "ramp_s": 0}, num_blocks=64
    )
    try:
        assert instance.workers == []
        wait_for(lambda: instance.planner_status()["ticks"] >= 2)
        assert instance.planner_status()["errors"] == 0
    finally:
        instance.close()
