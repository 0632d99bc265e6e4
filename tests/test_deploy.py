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
