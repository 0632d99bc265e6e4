"""``create_serving_instance``'s node keywords read as the deployment file reads a node group
(``cluster.api.instance_node``): the same names, older ones included, refused by name when unknown.
No worker starts."""

from __future__ import annotations

import pytest

from interlock.cluster.api import instance_node
from interlock.deploy import DEFAULT_MAX_NUM_SEQS, NodeGroup
from interlock.errors import ConfigError


def test_node_keywords_are_the_files_node_keys() -> None:
    node = instance_node("decode", {"max_num_seqs": 4, "tier_load_timeout_s": 0.5, "tier_load_min_mib_s": 8})
    assert node == NodeGroup(
        node_role="decode", gpu_count=0, max_num_seqs=4, tier_load_timeout_s=0.5, tier_load_min_mib_s=8.0
    )
    assert instance_node("both", {}).max_num_seqs == DEFAULT_MAX_NUM_SEQS


def test_older_names_still_work() -> None:
    assert instance_node("both", {"max_batch_size": 2}).max_num_seqs == 2
    assert instance_node("both", {"kv_cache_transfer": "tcp"}).transfer == "tcp"


@pytest.mark.parametrize(
    ("node", "message"),
    [
        ({"colour": 1}, "create_serving_instance.colour: unknown key"),
        ({"tier_load_timeout_s": "2s"}, "create_serving_instance.tier_load_timeout_s: expected float"),
        ({"gpu_count": 2}, "create_serving_instance: gpu_count: give role= and min_replicas="),
        ({"node_role": "prefill"}, "create_serving_instance: node_role: give role="),
    ],
)
def test_bad_node_keywords_are_refused_by_name(node: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        instance_node("both", node)
