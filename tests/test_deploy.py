from dataclasses import replace
from pathlib import Path

import pytest

from interlock.deploy import Deployment, load_deployment, parse_deployment
from interlock.errors import ConfigError

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "cluster.yaml"


def test_example_file_loads():
    d = load_deployment(EXAMPLE)
    assert d.control_plane.listen_port == 8000
    assert d.routing.policy == "kv" and d.routing.route_key == "x-business-line"
    assert d.execution_groups[0].nodes[0].max_batch_size == 32
    assert d.num_workers == 2
    assert d.metrics.figures == ("requests", "ttft", "itl", "tokens", "kv")


def test_empty_file_gives_defaults():
    assert parse_deployment(None) == Deployment()


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        ({"routing": {"polcy": "kv"}}, "routing.polcy"),
        ({"routing": {"policy": "fastest"}}, "routing.policy"),
        ({"bogus": {}}, "bogus"),
        ({"control-plane": {"listen_port": 70000}}, "control-plane.listen_port"),
        ({"control-plane": {"health_checks": "yes"}}, "control-plane.health_checks"),
        ({"execution-group": {"nodes": [{"node_role": "gpu"}]}}, "execution-group.nodes[0].node_role"),
        ({"execution-group": {"nodes": [{"count": "2"}]}}, "execution-group.nodes[0].count"),
        ({"execution-group": {"nodes": [{"kv_cache_transfer": "rdma"}]}}, "kv_cache_transfer"),
        ({"metrics": {"figures": ["ttft", "vibes"]}}, "metrics.figures"),
        ({"routing": {"route_key": " "}}, "routing.route_key"),
    ],
)
def test_bad_values_are_rejected_naming_the_key(raw, named):
    with pytest.raises(ConfigError) as e:
        parse_deployment(raw)
    assert named in str(e.value)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_deployment(tmp_path / "nope.yaml")


def test_hyphenated_keys_accepted():
    d = parse_deployment({"control-plane": {"heartbeat-interval": 0.5, "heartbeat-timeout": 2}})
    assert d.control_plane.heartbeat_interval == 0.5 and d.control_plane.heartbeat_timeout == 2.0


def test_policies_match_the_router():
    from interlock.deploy import POLICIES
    from interlock.router.policies import POLICIES as ROUTER_POLICIES

    assert POLICIES == ROUTER_POLICIES


# ---- each key's effect on the running system ----

def _worker_specs(tmp_path, node: dict, routing: dict, *flags: str):
    """The worker specs ``serve -f`` builds from a deployment (a fake model folder: nothing loads)."""
    import json

    import yaml

    from interlock.cli.serve import build_parser, deployment_from_args, worker_specs

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (model / "model.safetensors").write_bytes(b"")
    f = tmp_path / "d.yaml"
    f.write_text(yaml.safe_dump({"execution-group": {"model": str(model), "runner": "mock",
                                                     "nodes": [node]}, "routing": routing}))
    a = build_parser().parse_args(["-f", str(f), *flags])
    return [spec for spec, _ in worker_specs(deployment_from_args(a), a)]


def _as_worker_process(spec):
    """The spec a worker child process rebuilds from the argv ``serve`` gives it."""
    from interlock.cli import worker
    from interlock.cli.serve import worker_argv

    argv = worker_argv(spec, "nats://127.0.0.1:4222", parse_deployment(None).control_plane, 1.0)
    return worker.resolve_spec(worker.build_parser().parse_args(argv[argv.index("worker") + 1 :]))


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
        sched.add_request(Request(rid, (1, 2, 3), SamplingParams(max_tokens=8), block_size=4,
                                  priority=prio, arrival=i))
        batch = sched.schedule()
    return [s.request_id for s in batch.scheduled] == ["urgent"]


@pytest.mark.parametrize(("routing", "flags", "preempts"), [
    ({}, (), False),
    ({"preempt_enabled": True}, (), True),
    ({"preempt_enabled": True}, ("--no-preempt-enabled",), False),
    ({}, ("--preempt-enabled",), True),
])
def test_preempt_enabled_reaches_every_worker_engine(tmp_path, routing, flags, preempts):
    specs = _worker_specs(tmp_path, {"count": 2}, routing, *flags)
    for spec in specs:
        assert spec.engine.scheduler.preempt_enabled is preempts
        assert _as_worker_process(spec).engine.scheduler.preempt_enabled is preempts
        assert _urgent_preempts(spec.engine.scheduler) is preempts


@pytest.mark.parametrize("threshold", [1, 32])
def test_queue_depth_threshold_reaches_the_router_per_worker(tmp_path, threshold):
    from interlock.cli.worker import worker_info
    from interlock.protocol.events import LoadReport
    from interlock.router import Decision, RequestMeta, Router, RouterConfig

    specs = _worker_specs(tmp_path, {"count": 2, "queue_depth_threshold": threshold}, {})
    assert [_as_worker_process(s).queue_depth_threshold for s in specs] == [threshold] * 2
    router = Router(RouterConfig(block_size=16, policy="round-robin"))
    for spec in specs:
        router.add_worker(worker_info(spec, block_size=16, kv_blocks_total=1000))
    for spec in specs:  # both workers report 2 requests waiting
        router.apply_load(LoadReport(instance_id=spec.instance_id, timestamp=1.0, num_running=1,
                                     num_waiting=2, kv_blocks_used=0, kv_blocks_total=1000,
                                     queued_prefill_tokens=0, step_time_s=0.0, tokens_computed=0))
    d = router.route(RequestMeta(request_id="r", prompt_tokens=10), token_ids=list(range(10)))
    assert isinstance(d, Decision) is (threshold > 2)
