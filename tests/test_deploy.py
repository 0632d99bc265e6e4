"""Deployment files: the design documents' file as written, durations, aliases, refusals by name.
What each key does to the running system is in ``tests/cluster/test_spec.py``."""

from pathlib import Path

import pytest

from interlock.deploy import Deployment, load_deployment, parse_deployment, parse_duration
from interlock.errors import ConfigError

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "cluster.yaml"


def test_the_seed_file_loads_as_written():
    d = load_deployment(EXAMPLE)
    cp = d.control_plane
    assert (cp.listen_port, cp.heartbeat_interval, cp.lease_timeout, cp.health_check_enabled) == (
        8000,
        5.0,
        25.0,
        True,
    )
    prefill, decode = d.execution_groups[0].nodes
    assert (prefill.node_role, prefill.gpu_count, prefill.max_num_seqs, prefill.queue_depth_threshold) == (
        "prefill",
        2,
        32,
        24,
    )
    assert (decode.node_role, decode.gpu_count, decode.transfer) == ("decode", 4, "tcp")
    assert d.routing.policy == "least-loaded" and d.routing.route_key == "x-business-line"
    assert d.metrics.export_interval == 10.0
    assert d.num_workers == 6 and d.disaggregated


def test_empty_file_gives_defaults():
    assert parse_deployment(None) == Deployment()


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("5s", 5.0),
        ("500ms", 0.5),
        ("2m", 120.0),
        ("1h", 3600.0),
        (3, 3.0),
        (0.25, 0.25),
        ("1.5", 1.5),
        (".5s", 0.5),
    ],
)
def test_durations_take_units(text, seconds):
    assert parse_duration(text, "x") == seconds


@pytest.mark.parametrize("bad", ["5 parsecs", "s", "", True, "-1s"])
def test_bad_durations_name_the_key(bad):
    with pytest.raises(ConfigError, match="metrics.export_interval: expected a duration"):
        parse_deployment({"metrics": {"export_interval": bad}})


def test_older_names_are_aliases():
    old = parse_deployment(
        {
            "control-plane": {"health_checks": False, "heartbeat-interval": 0.5, "heartbeat-timeout": 2},
            "execution-group": {"nodes": [{"count": 3, "kv_cache_transfer": "tcp", "max_batch_size": 8}]},
            "routing": {"router_mode": "round_robin"},
            "metrics": {"figures": ["ttft", "load"]},
        }
    )
    new = parse_deployment(
        {
            "control-plane": {
                "health_check_enabled": False,
                "heartbeat_interval": "500ms",
                "heartbeat_timeout": "2s",
            },
            "execution-group": {
                "nodes": [
                    {"gpu_count": 3, "kv_cache_transfer": True, "cache_transport": "tcp", "max_num_seqs": 8}
                ]
            },
            "routing": {"policy": "round-robin"},
            "metrics": {"figures": ["ttft", "queue_depth"]},
        }
    )
    assert old.control_plane == new.control_plane and old.execution_groups == new.execution_groups
    assert old.routing == new.routing and old.metrics.families == new.metrics.families
    assert (
        parse_deployment({"execution-group": {"nodes": [{"kv_cache_transfer": "none"}]}}).nodes[0].transfer
        == "none"
    )


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        ({"routing": {"polcy": "kv"}}, "routing.polcy: unknown key"),
        ({"routing": {"policy": "fastest"}}, "routing.policy: 'fastest' is not one of kv, round-robin"),
        (
            {"routing": {"stall_over": "queued"}},
            "routing.stall_over: 'queued' is not one of decoding, inflight",
        ),
        ({"bogus": {}}, "bogus: unknown section"),
        ({"control-plane": {"listen_port": 70000}}, "control-plane.listen_port"),
        (
            {"control-plane": {"health_check_enabled": "yes"}},
            "control-plane.health_check_enabled: expected bool",
        ),
        (
            {"control-plane": {"heartbeat_interval": "5s", "heartbeat_timeout": "2s"}},
            "heartbeat_timeout must be greater",
        ),
        ({"execution-group": {"nodes": [{"node_role": "gpu"}]}}, "execution-group.nodes[0].node_role"),
        (
            {"execution-group": {"nodes": [{"gpu_count": "2"}]}},
            "execution-group.nodes[0].gpu_count: expected int",
        ),
        (
            {"execution-group": {"nodes": [{"kv_cache_transfer": "rdma"}]}},
            "kv_cache_transfer: expected true or false (or a transport: auto, inproc, shm, tcp), got 'rdma'",
        ),
        (
            {"execution-group": {"nodes": [{"cache_transport": "rdma"}]}},
            "execution-group.nodes[0].cache_transport: 'rdma' is not one of auto, inproc, shm, tcp",
        ),
        (
            {"execution-group": {"nodes": [{"kv_cache_transfer": "tcp", "cache_transport": "shm"}]}},
            "contradicts",
        ),
        ({"execution-group": {"nodes": [{"count": 1, "gpu_count": 2}]}}, "given twice"),
        (
            {"execution-group": {"nodes": [{"node_role": "decode", "kv_cache_transfer": False}]}},
            "nodes[0].kv_cache_transfer: a decode worker needs it",
        ),
        (
            {"execution-group": {"tensor_parallel_size": 2, "runner": "mock"}},
            "execution-group.runner: tensor/pipeline parallelism runs the real model",
        ),
        ({"execution-group": {"pipeline_parallel_size": 0}}, "must be >= 1"),
        (
            {"execution-group": {"pipeline_parallel_size": 2, "nodes": [{"node_role": "prefill"}]}},
            "nodes[0].node_role: prefill needs KV transfer",
        ),
        ({"execution-group": {"speedup": 5}}, "execution-group.speedup: only the mock runner"),
        ({"execution-group": {"runner": "jax"}}, "execution-group.runner: 'jax' is not one of torch, mock"),
        (
            {"execution-group": {"max_replicas": 1, "nodes": [{"gpu_count": 2}]}},
            "execution-group.max_replicas",
        ),
        ({"execution-group": {"nodes": [{"gpu_count": 0}]}}, "at least one worker"),
        (
            {"execution-group": {"engine": "vllm", "colocate": [{"served_model_name": "b"}]}},
            "execution-group.colocate: a worker of the interlock engine with one rank",
        ),
        (
            {"execution-group": {"colocate": [{"served_model_name": "b", "nodes": [{"count": 2}]}]}},
            "colocate[0].nodes: one node group of count 1",
        ),
        ({"execution-group": {"colocate": [{"model": "smollm2"}]}}, "'smollm2' is served twice"),
        (
            {"execution-group": {"colocate": [{"served_model_name": "b", "colocate": [{"model": "c"}]}]}},
            "colocate[0].colocate: a colocated model hosts no models",
        ),
        ({"execution-group": {"colocate": {"model": "b"}}}, "colocate: expected a list"),
        (
            {"execution-group": {"runner": "mock", "offload_after_s": 5}},
            "offload_after_s: the mock runner has no weights",
        ),
        (
            {"execution-group": {"engine": "vllm", "offload_after_s": 5}},
            "offload_after_s: vLLM's sleep mode needs a CUDA device",
        ),
        ({"metrics": {"figures": ["ttft", "vibes"]}}, "metrics.figures: unknown ['vibes']"),
        ({"routing": {"route_key": " "}}, "routing.route_key"),
        (
            {"execution-group": {"engine": "sglang"}},
            "execution-group.engine: 'sglang' is not one of interlock, vllm",
        ),
        (
            {"execution-group": {"engine_args": {"enforce_eager": True}}},
            "engine_args: vLLM's engine arguments need",
        ),
        ({"execution-group": {"engine": "vllm", "engine_args": ["x"]}}, "engine_args: expected a mapping"),
        (
            {"execution-group": {"engine": "vllm", "block_size": 16}},
            "block_size: vLLM on a CPU needs a multiple of 32",
        ),
        (
            {"execution-group": {"engine": "vllm", "runner": "mock"}},
            "execution-group.runner: 'mock' is the interlock",
        ),
        (
            {"execution-group": {"engine": "vllm", "nodes": [{"cache_transport": "inproc"}]}},
            "nodes[0].cache_transport: vLLM workers hand KV over NIXL",
        ),
        (
            {"execution-group": {"engine": "vllm"}, "routing": {"preempt_enabled": True}},
            "routing.preempt_enabled: the interlock engine's",
        ),
        (
            {"execution-group": {"engine": "vllm", "nodes": [{"host_kv_gib": 1}]}},
            "nodes[0].host_kv_gib: not with engine vllm",
        ),
        (
            {"execution-group": {"engine": "vllm", "nodes": [{"tier_load_timeout_s": 5}]}},
            "nodes[0].tier_load_timeout_s: not with engine vllm",
        ),
        (
            {"execution-group": {"nodes": [{"tier_load_timeout_s": 0}]}},
            "execution-group.nodes[0].tier_load_timeout_s: must be positive and finite",
        ),
        (
            {"execution-group": {"nodes": [{"tier_load_min_mib_s": float("inf")}]}},
            "execution-group.nodes[0].tier_load_min_mib_s: must be positive and finite",
        ),
        (
            {"execution-group": {"nodes": [{"tier_load_timeout_s": "2s"}]}},
            "execution-group.nodes[0].tier_load_timeout_s: expected float",
        ),
        (
            {"execution-group": {"nodes": [{"tier_load_deadline_s": 2}]}},
            "execution-group.nodes[0].tier_load_deadline_s: unknown key",
        ),
        (
            {"execution-group": {"nodes": [{"max_batch_size": 4, "max_num_seqs": 8}]}},
            "max_num_seqs: given twice",
        ),
    ],
)
def test_bad_values_are_refused_naming_the_key(raw, named):
    with pytest.raises(ConfigError) as e:
        parse_deployment(raw)
    assert named in str(e.value)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_deployment(tmp_path / "nope.yaml")


def test_collect_switches_remove_their_family():
    d = parse_deployment({"metrics": {"collect_queue_depth": False, "collect_gpu_utilization": False}})
    assert "queue_depth" not in d.metrics.families and "gpu_utilization" not in d.metrics.families
    assert "kv_cache_miss" in d.metrics.families
    d = parse_deployment({"metrics": {"collect_kv_cache_miss": False, "figures": ["ttft", "kv_cache_miss"]}})
    assert d.metrics.families == {"ttft"}


def test_names_are_defined_once():
    from interlock.deploy import POLICIES as DEPLOY_POLICIES
    from interlock.names import POLICIES, ROLES
    from interlock.protocol.discovery import ROLES as WIRE_ROLES
    from interlock.router.policies import POLICIES as ROUTER_POLICIES

    assert DEPLOY_POLICIES is POLICIES is ROUTER_POLICIES and WIRE_ROLES is ROLES


def test_a_vllm_group_carries_its_engine_args_to_the_worker_spec():
    from interlock.cluster.spec import ClusterSpec, ResolvedGroup, worker_spec

    d = parse_deployment(
        {"execution-group": {"engine": "vllm", "engine_args": {"enforce-eager": True, "swap_space": 0}}}
    )
    g = d.execution_groups[0]
    assert g.engine_args == (("enforce_eager", True), ("swap_space", 0))
    spec = ClusterSpec(deployment=d)
    ws = worker_spec(
        spec, ResolvedGroup(0, g, "/m", "m", 2048), g.nodes[0], instance_id="w0", device="cpu", threads=1
    )
    assert ws.engine.model.engine == "vllm"
    assert ws.engine.model.engine_args == g.engine_args
    assert ws.engine.cache.block_size == 32  # vLLM's CPU blocks are multiples of 32
    assert not ws.engine.cache.shared_kv_cache  # the interlock engine's one copy, not vLLM's


def test_routing_queue_timeout_is_read_and_checked() -> None:
    from interlock.cluster.spec import dispatch_options
    from interlock.deploy import parse_deployment

    groups = [{"model": "smollm2", "nodes": [{"gpu_count": 1}]}]
    d = parse_deployment({"execution_groups": groups, "routing": {"queue_timeout_s": 90}})
    assert dispatch_options(d.routing).queue_timeout_s == 90.0
    with pytest.raises(ConfigError, match="queue_timeout_s must be positive"):
        parse_deployment({"execution_groups": groups, "routing": {"queue_timeout_s": 0}})


def test_a_file_starting_no_worker_needs_the_planner_section_read() -> None:
    from interlock.deploy import PLANNER_SECTION, parse_deployment

    groups = [{"model": "smollm2", "nodes": [{"gpu_count": 0}]}]
    with pytest.raises(ConfigError, match="at least one worker"):
        parse_deployment({"execution_groups": groups})
    assert parse_deployment({"execution_groups": groups}, read_by=(PLANNER_SECTION,)).num_workers == 0


def test_a_colocated_model_is_one_engine_in_each_worker_of_its_host() -> None:
    d = parse_deployment(
        {
            "execution-group": {
                "nodes": [{"count": 2}],
                "colocate": [{"served_model_name": "b", "offload_after_s": 3}],
            }
        }
    )
    (guest,) = d.execution_groups[0].colocate
    assert (guest.served_model_name, guest.offload_after_s, guest.nodes[0].gpu_count) == ("b", 3.0, 1)
    assert d.num_workers == 2  # processes: the guest lives in them
