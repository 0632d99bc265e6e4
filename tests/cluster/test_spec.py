"""Each deployment key's effect on what the builder starts: worker specs (as a worker process
receives them), the router service and the frontend. No model is loaded (a fake model folder)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from interlock.cluster.spec import (
    ClusterSpec,
    disagg_config,
    resolve_groups,
    router_config,
    service_options,
    worker_specs,
)
from interlock.cluster.worker import WorkerLaunch, WorkerSpec, transfer_agent
from interlock.deploy import DEFAULT_MAX_NUM_SEQS, Deployment, load_deployment, parse_deployment
from interlock.engine.config import EngineConfig
from interlock.errors import ConfigError


@pytest.fixture
def model(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps({"architectures": ["LlamaForCausalLM"], "max_position_embeddings": 4096})
    )
    (folder / "model.safetensors").write_bytes(b"")
    return folder


def deployment(
    model: Path, group: dict | None = None, node: dict | None = None, **sections: dict
) -> Deployment:
    g = {"model": str(model), "runner": "mock", **(group or {}), "nodes": [{"gpu_count": 2, **(node or {})}]}
    return parse_deployment({"execution-group": g, **sections})


def specs(d: Deployment, **spec: object) -> list[WorkerSpec]:
    """The worker specs, each as the worker process decodes it from its stdin."""
    cs = ClusterSpec(deployment=d, **spec)  # type: ignore[arg-type]
    out = worker_specs(cs, resolve_groups(d, progress=False), prefix="t")
    return [WorkerLaunch.decode(WorkerLaunch(s, "nats://127.0.0.1:4222").encode()).spec for s in out]


def test_gpu_count_is_workers_per_node_group_in_order(model: Path) -> None:
    d = parse_deployment(
        {
            "execution-group": {
                "model": str(model),
                "runner": "mock",
                "nodes": [{"node_role": "prefill", "gpu_count": 2}, {"node_role": "decode", "gpu_count": 3}],
            }
        }
    )
    got = specs(d)
    assert [s.role for s in got] == ["prefill"] * 2 + ["decode"] * 3
    assert [s.instance_id for s in got] == [f"w{i}-t" for i in range(5)]


def test_cuda_devices_are_spread_one_per_worker(model: Path) -> None:
    d = deployment(model, {"device": "cuda"}, {"gpu_count": 3})
    assert [s.engine.model.device for s in specs(d)] == ["cuda:0", "cuda:1", "cuda:2"]
    assert {s.engine.model.device for s in specs(deployment(model))} == {"cpu"}


def test_cpu_threads_are_shared_unless_given(model: Path) -> None:
    import os

    share = max(1, (os.cpu_count() or 1) // 2)
    assert {s.engine.model.num_threads for s in specs(deployment(model))} == {share}
    assert {s.engine.model.num_threads for s in specs(deployment(model, {"threads": 3}))} == {3}


@pytest.mark.parametrize(
    ("node", "field", "want"),
    [
        ({"max_num_seqs": 7}, lambda s: s.engine.scheduler.max_num_seqs, 7),
        ({"max_batch_size": 7}, lambda s: s.engine.scheduler.max_num_seqs, 7),  # the older key
        ({}, lambda s: s.engine.scheduler.max_num_seqs, DEFAULT_MAX_NUM_SEQS),
        ({"tier_load_timeout_s": 0.5}, lambda s: s.engine.cache.tier_load_timeout_s, 0.5),
        ({"tier_load_min_mib_s": 8}, lambda s: s.engine.cache.tier_load_min_mib_s, 8.0),
        ({"max_num_batched_tokens": 96}, lambda s: s.engine.scheduler.max_num_batched_tokens, 96),
        ({"kv_cache_gib": 0.25}, lambda s: s.engine.cache.kv_cache_gib, 0.25),
        ({"num_blocks": 77}, lambda s: s.engine.cache.num_blocks, 77),
        ({"queue_depth_threshold": 5}, lambda s: s.queue_depth_threshold, 5),
        ({"kv_cache_transfer": False}, lambda s: s.kv_transfer, "none"),
        ({"cache_transport": "shm"}, lambda s: s.kv_transfer, "shm"),
        ({"node_role": "decode"}, lambda s: s.role, "decode"),
        ({"host_kv_gib": 0.5}, lambda s: s.engine.cache.host_kv_gib, 0.5),
        ({"host_kv_gib": 0.5, "host_kv_shared": "node1"}, lambda s: s.engine.cache.host_kv_shared, "node1"),
        (
            {"disk_kv_gib": 2, "disk_kv_path": "/var/kv"},
            lambda s: (s.engine.cache.disk_kv_gib, s.engine.cache.disk_kv_path),
            (2.0, "/var/kv"),
        ),
    ],
)
def test_node_keys_reach_every_worker(model: Path, node: dict, field, want) -> None:
    assert {field(s) for s in specs(deployment(model, node=node))} == {want}


def test_a_files_tier_load_deadline_reaches_the_engines_cache_config(model: Path, tmp_path: Path) -> None:
    file = tmp_path / "deploy.yaml"
    node = {"gpu_count": 1, "host_kv_gib": 0.5, "tier_load_timeout_s": 0.25, "tier_load_min_mib_s": 10}
    file.write_text(
        yaml.safe_dump({"execution-group": {"model": str(model), "runner": "mock", "nodes": [node]}})
    )
    [spec] = specs(load_deployment(file))
    cache = spec.engine.cache
    assert (cache.host_kv_gib, cache.tier_load_timeout_s, cache.tier_load_min_mib_s) == (0.5, 0.25, 10.0)
    file.write_text(file.read_text().replace("tier_load_min_mib_s", "tier_load_min_mbps"))
    with pytest.raises(ConfigError, match=r"nodes\[0\]\.tier_load_min_mbps: unknown key"):
        load_deployment(file)


@pytest.mark.parametrize(
    ("group", "field", "want"),
    [
        ({"served_model_name": "mine"}, lambda s: s.served_name, "mine"),
        ({"dtype": "float32", "runner": "torch"}, lambda s: s.engine.model.dtype, "float32"),
        ({"block_size": 32}, lambda s: s.engine.cache.block_size, 32),
        ({"max_model_len": 1000}, lambda s: s.engine.scheduler.max_model_len, 1000),
        ({}, lambda s: s.engine.scheduler.max_model_len, 4096),  # the model's own
        ({"enable_prefix_caching": False}, lambda s: s.engine.cache.enable_prefix_caching, False),
        ({"speedup": 50}, lambda s: s.speedup, 50.0),
        ({"runner": "mock"}, lambda s: s.engine.model.runner, "mock"),
    ],
)
def test_group_keys_reach_every_worker(model: Path, group: dict, field, want) -> None:
    assert {field(s) for s in specs(deployment(model, group))} == {want}


def test_export_interval_is_the_workers_report_period(model: Path) -> None:
    d = deployment(model, metrics={"export_interval": "250ms"})
    assert {s.export_interval_s for s in specs(d)} == {0.25}


def test_cache_transport_forces_the_pull_transport() -> None:
    from interlock.transfer import TransferAgent

    base = WorkerSpec(engine=EngineConfig(), served_name="m", model_path="/m", role="decode", instance_id="x")
    assert transfer_agent(replace(base, kv_transfer="none")) is None
    with (
        TransferAgent() as source,
        transfer_agent(replace(base, kv_transfer="tcp")) as tcp,
        transfer_agent(base) as auto,
    ):
        src = source.create_source(16)
        desc = src.publish()
        assert auto.choose_transport(desc) == "inproc"  # same process: auto takes the shortcut
        dst = tcp.pull(desc, timeout_s=5)
        assert dst.transport == "tcp" and dst.finished_event.wait(5)
        dst.release()


def test_control_plane_keys_shape_health_checks_and_leases(model: Path) -> None:
    on = ClusterSpec(deployment=deployment(model, **{"control-plane": {"heartbeat_interval": "2s"}}))
    assert service_options(on).health_check_s == 2.0
    assert on.deployment.control_plane.lease_timeout == 10.0
    off = ClusterSpec(deployment=deployment(model, **{"control-plane": {"health_check_enabled": False}}))
    assert service_options(off).health_check_s is None


def test_routing_keys_shape_the_router(model: Path) -> None:
    d = deployment(
        model,
        node={"max_num_batched_tokens": 512},
        routing={
            "policy": "power_of_two",
            "kv_usage_watermark": 0.5,
            "queue_size": 9,
            "max_remote_kv_bytes": 1000,
            "stall_over": "inflight",
        },
    )
    spec = ClusterSpec(deployment=d)
    rc = router_config(spec)
    assert (rc.policy, rc.queue_capacity, rc.cost.kv_watermark, rc.cost.chunk_tokens, rc.cost.stall_over) == (
        "power-of-two",
        9,
        0.5,
        512,
        "inflight",
    )
    dc = disagg_config(spec)
    assert (dc.enforce, dc.max_kv_bytes, dc.chunk_tokens) == (False, 1000, 512)


def test_fallback_to_local_false_enforces_disaggregation_and_needs_prefill_workers(model: Path) -> None:
    both = deployment(model, routing={"fallback_to_local": False})
    with pytest.raises(
        ConfigError, match="routing.fallback_to_local: false: needs a node group with node_role prefill"
    ):
        ClusterSpec(deployment=both)
    assert disagg_config(
        ClusterSpec(deployment=both, start_workers=False)
    ).enforce  # a frontend: roles unknown
    split = parse_deployment(
        {
            "execution-group": {
                "model": str(model),
                "nodes": [{"node_role": "prefill"}, {"node_role": "decode"}],
            },
            "routing": {"enforce_disagg": True},
        }
    )
    assert disagg_config(ClusterSpec(deployment=split)).enforce


def test_the_seed_file_derives_six_workers(model: Path) -> None:
    raw = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "cluster.yaml").read_text())
    raw["execution-group"]["model"] = str(model)
    raw["execution-group"]["runner"] = "mock"
    got = specs(parse_deployment(raw))
    assert [(s.role, s.kv_transfer, s.engine.scheduler.max_num_seqs) for s in got] == (
        [("prefill", "auto", 32)] * 2 + [("decode", "tcp", 64)] * 4
    )
    assert {s.export_interval_s for s in got} == {10.0}


def _urgent_preempts(scheduler_config) -> bool:
    """A full engine (one batch slot, taken by a priority-5 request) gets a priority-0 request."""
    from interlock.engine.block_pool import BlockPool
    from interlock.engine.kv_cache_manager import KVCacheManager
    from interlock.engine.request import Request
    from interlock.engine.scheduler import Scheduler
    from interlock.protocol import SamplingParams

    cfg = replace(scheduler_config, max_num_seqs=1)
    sched = Scheduler(cfg, KVCacheManager(BlockPool(64, 4)))
    for i, (rid, prio) in enumerate((("bulk", 5), ("urgent", 0))):
        sched.add_request(
            Request(rid, (1, 2, 3), SamplingParams(max_tokens=8), block_size=4, priority=prio, arrival=i)
        )
        batch = sched.schedule()
    return [s.request_id for s in batch.scheduled] == ["urgent"]


@pytest.mark.parametrize("preempt", [False, True])
def test_preempt_enabled_reaches_every_worker_engine(model: Path, preempt: bool) -> None:
    for spec in specs(deployment(model, routing={"preempt_enabled": preempt})):
        assert spec.engine.scheduler.preempt_enabled is preempt
        assert _urgent_preempts(spec.engine.scheduler) is preempt


@pytest.mark.parametrize("threshold", [1, 32])
def test_queue_depth_threshold_reaches_the_router_per_worker(model: Path, threshold: int) -> None:
    from interlock.cluster.worker import worker_info
    from interlock.protocol.events import LoadReport
    from interlock.router import Decision, RequestMeta, Router, RouterConfig

    router = Router(RouterConfig(block_size=16, policy="round-robin"))
    got = specs(deployment(model, node={"queue_depth_threshold": threshold}))
    for spec in got:
        router.add_worker(worker_info(spec, block_size=16, kv_blocks_total=1000))
    for spec in got:  # both workers report 2 requests waiting
        router.apply_load(
            LoadReport(
                instance_id=spec.instance_id,
                timestamp=1.0,
                num_running=1,
                num_waiting=2,
                kv_blocks_used=0,
                kv_blocks_total=1000,
                queued_prefill_tokens=0,
                step_time_s=0.0,
                tokens_computed=0,
            )
        )
    d = router.route(RequestMeta(request_id="r", prompt_tokens=10), token_ids=list(range(10)))
    assert isinstance(d, Decision) is (threshold > 2)
