"""cluster.layout: this host described for the placement optimizer, and the layout an
execution group's ``optimization_profile`` gets."""

from __future__ import annotations

import pytest

from interlock.cluster.layout import choose_layout, describe_cpu
from interlock.cluster.spec import resolve_groups
from interlock.deploy import OPTIMIZATION_PROFILES, Deployment, ExecutionGroup, parse_deployment
from interlock.errors import ConfigError
from interlock.model_store import resolve_model
from interlock.planner.parallel_plan import PROFILES


def test_one_list_of_profiles() -> None:
    assert OPTIMIZATION_PROFILES == PROFILES


def test_a_cpu_host_is_one_device_unless_its_cores_are_asked_for() -> None:
    host = describe_cpu(bandwidth=20e9)
    assert host.devices == 1 and host.device.name.startswith("cpu (")
    assert any("one device" in line for line in host.assumed)
    cores = describe_cpu(bandwidth=20e9, as_cores=True)
    assert cores.devices >= 1 and cores.device.name == "cpu core"
    assert cores.device.flops * cores.devices == host.device.flops


@pytest.mark.parametrize("profile", ["high_throughput", "low_latency"])
def test_on_one_cpu_host_a_profile_keeps_one_rank(profile: str) -> None:
    d = parse_deployment({"execution-group": {"optimization_profile": profile, "runner": "torch"}})
    (rg,) = resolve_groups(d, progress=False)
    assert (rg.group.tensor_parallel_size, rg.group.pipeline_parallel_size) == (1, 1)


def test_pinned_sizes_stay_and_are_said() -> None:
    g = ExecutionGroup(optimization_profile="low_latency", tensor_parallel_size=2)
    plan = choose_layout(
        g, resolve_model("smollm2", progress=False), describe_cpu(bandwidth=20e9, as_cores=True)
    )
    assert plan.tensor == 2 and plan.pinned == ("tensor 2",)


def test_a_profile_for_vllm_or_unknown_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="optimization_profile: 'fastest' is not one of"):
        parse_deployment({"execution-group": {"optimization_profile": "fastest"}})
    with pytest.raises(ConfigError, match="give vLLM its sizes"):
        parse_deployment({"execution-group": {"optimization_profile": "low_latency", "engine": "vllm"}})
    assert Deployment().execution_groups[0].optimization_profile is None


def test_a_cut_is_refused_at_start_by_the_engine_s_rule() -> None:
    for engine, why in (
        ("interlock", "tensor_parallel_size 10 exceeds the model's 9 attention heads"),
        ("vllm", "vLLM needs the model's 9 attention heads divisible by tensor_parallel_size 2"),
    ):
        size = 10 if engine == "interlock" else 2
        d = parse_deployment({"execution-group": {"engine": engine, "tensor_parallel_size": size}})
        with pytest.raises(ConfigError, match=why):
            resolve_groups(d, progress=False)
