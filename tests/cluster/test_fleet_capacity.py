"""Host capacity, as the issue reported it: on a 2-core host, CPU-engine workers of one thread
each fit twice; a third is refused by the builder, and a planner under pressure holds with the
reason instead of adding. The host is declared (``placement:``), so the test does not depend on
this machine; the workers are real in-process workers serving the in-package mock engine."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from interlock.cluster.builder import start_cluster
from interlock.cluster.fleet import ClusterFleet
from interlock.cluster.hosts import local_host, model_footprint
from interlock.cluster.spec import ClusterSpec, PlacementConfig, ProcessOptions, parse_placement
from interlock.deploy import parse_deployment
from interlock.engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from interlock.engine.factory import build_engine
from interlock.errors import ConfigError
from interlock.planner import PlannerConfig, RoleBounds, build_planner
from interlock.planner.loop import FakeLoadView, PlannerLoop
from interlock.planner.placement import GIB


@pytest.fixture
def model(tmp_path: Path) -> Path:
    """A model folder as placement reads it (shapes and weight files); nothing loads it."""
    folder = tmp_path / "model"
    folder.mkdir()
    shape = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 64}
    (folder / "config.json").write_text(
        json.dumps({"architectures": ["LlamaForCausalLM"], "max_position_embeddings": 512, **shape})
    )
    (folder / "model.safetensors").write_bytes(b"\0" * 1000)
    return folder


def spec(model: Path, placement: PlacementConfig, **group: Any) -> ClusterSpec:
    g = {"model": str(model), "runner": "torch", "threads": 1, "nodes": [{"gpu_count": 1, "num_blocks": 64}]}
    d = parse_deployment({"execution-group": {**g, **group}})
    return ClusterSpec(
        deployment=d,
        frontend=None,
        start_workers=False,  # the test adds them, each with the mock engine
        processes=ProcessOptions(in_process=True, drain_grace_s=1.0),
        placement=placement,
    )


def mock_core() -> Any:
    return build_engine(
        EngineConfig(
            model=ModelConfig(runner="mock"),
            cache=CacheConfig(num_blocks=64),
            scheduler=SchedulerConfig(max_model_len=512),
        )
    )


TWO_CORES = PlacementConfig(cores=2, memory_gib=64)


def test_a_two_core_host_takes_two_one_thread_workers_and_refuses_a_third(model: Path) -> None:
    async def main() -> None:
        c = await start_cluster(spec(model, TWO_CORES))
        try:
            fleet = ClusterFleet(c)
            rooms = [await fleet.capacity()]
            handles = []
            for _ in range(2):
                handles.append(await c.add_worker("both", core=mock_core()))
                rooms.append(await fleet.capacity())
            assert [r.room for r in rooms] == [2, 1, 0]
            assert rooms[-1].reason == "host local: 2.0 of 2 cores used, 0.0 headroom"
            with pytest.raises(
                ConfigError,
                match=r"no room for worker w2-\w+ \(needs 1 cores, .*\): host local: 2.0 of 2 cores used",
            ):
                await c.add_worker("both", core=mock_core())
            assert await c.wait_serving(handles, 10.0) is None
            assert (await fleet.capacity()).startup_s > 0  # both measured from launch to registered
            await c.remove_worker(handles[0], drain=False)
            assert (await fleet.capacity()).room == 1  # its core is free once it stopped
        finally:
            await c.close()

    asyncio.run(main())


def test_a_planner_under_pressure_holds_with_the_reason_instead_of_adding(model: Path) -> None:
    cfg = PlannerConfig(both=RoleBounds(1, 4), window_s=10.0, interval_s=5.0, max_changes=100)

    async def main() -> None:
        c = await start_cluster(spec(model, TWO_CORES))
        try:
            handles = [await c.add_worker("both", core=mock_core()) for _ in range(2)]
            assert await c.wait_serving(handles, 10.0) is None
            now = [0.0]
            view = FakeLoadView()
            view.queue = 50  # requests wait at the router: the pool asks to grow
            loop = PlannerLoop(build_planner(cfg), ClusterFleet(c), view, clock=lambda: now[0])
            for _ in range(12):
                assert await loop.tick() == []
                now[0] += 5.0
            status = loop.status()
            assert status["decisions"] == [] and status["errors"] == 0
            hold = str(status["holding"])
            assert "cannot grow" in hold
            assert hold.endswith("no room on the hosts: host local: 2.0 of 2 cores used, 0.0 headroom")
            assert len(c.workers()) == 2
        finally:
            await c.close()

    asyncio.run(main())


def test_default_threads_never_exceed_the_free_cores(model: Path) -> None:
    """``threads: 0`` shares the host's cores among the most workers the group may run
    (``max_replicas``), never beyond the cores still free."""

    async def main() -> None:
        c = await start_cluster(
            spec(model, PlacementConfig(cores=4, memory_gib=64), threads=0, max_replicas=2)
        )
        try:
            first = await c.add_worker("both", core=mock_core())
            assert first.spec.engine.model.num_threads == 2
            assert await c.room(0) == (1, "host local: 2.0 of 4 cores used, 0.0 headroom")
        finally:
            await c.close()

    asyncio.run(main())


def test_memory_binds_with_the_weights_and_kv_budget(model: Path) -> None:
    weights, kv_token = model_footprint(str(model))
    assert weights == 1000 and kv_token == 2 * 2 * 2 * 16 * 4

    async def main() -> None:
        # 768 MiB of process + 1 GiB of KV (kv_cache_gib's default) + the weights: over 1.5 GiB
        c = await start_cluster(
            spec(model, PlacementConfig(cores=8, memory_gib=1.5), nodes=[{"gpu_count": 1}])
        )
        try:
            assert await c.room(0) == (0, "host local: 0.0 of 1.5 GiB memory used, 0.0 GiB headroom")
            with pytest.raises(
                ConfigError, match=r"needs 1 cores, 1.8 GiB memory\): host local: 0.0 of 1.5 GiB"
            ):
                await c.add_worker("both", core=mock_core())
        finally:
            await c.close()

    asyncio.run(main())


def test_placement_section_keys_are_used_or_refused_by_name() -> None:
    cfg = parse_placement({"cores": 2, "headroom-cores": 0.5, "memory_gib": 8, "devices": 0})
    assert cfg == PlacementConfig(cores=2, memory_gib=8, devices=0, headroom_cores=0.5)
    assert cfg.headroom.cores == 0.5 and cfg.host(replace_host()).memory_bytes == 8 * GIB
    with pytest.raises(ConfigError, match=r"placement.cpus: unknown key \(known: cores, devices"):
        parse_placement({"cpus": 2})
    with pytest.raises(ConfigError, match="placement.devices: expected an integer"):
        parse_placement({"devices": 1.5})
    with pytest.raises(ConfigError, match="placement.cores: 1 leaves nothing beside headroom_cores 1"):
        parse_placement({"cores": 1, "headroom_cores": 1})


def replace_host() -> Any:
    from interlock.planner.placement import Host

    return Host("local", 16.0, 0, None)


def test_the_detected_host_is_this_process_s_cores() -> None:
    import os

    host = local_host()
    assert host.cores == len(os.sched_getaffinity(0)) and host.name == "local"
    assert host.memory_bytes is None or host.memory_bytes > 0
