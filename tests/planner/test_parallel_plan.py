"""The placement optimizer's choices: profiles, fit, hosts, pins, the engine's cut rule, MoE, the
prefill/decode split, and the paper cases of docs/partitioning.md (Llama-3-70B and Mixtral-8x7B
on 8 x 80 GiB H100s)."""

from __future__ import annotations

import dataclasses
import json
from functools import partial
from pathlib import Path

import pytest

from interlock.engine.model.config import ModelArchConfig
from interlock.engine.model.partition import check_sizes
from interlock.errors import ConfigError
from interlock.planner import parallel_plan
from interlock.planner.parallel_plan import (
    Cluster,
    DeviceSpec,
    ModelShape,
    NoPlan,
    Pins,
    Plan,
    Workload,
    choose,
)
from interlock.planner.parallel_shapes import GIB

CONFIGS = Path(__file__).parents[2] / "examples" / "configs"
H100 = DeviceSpec(80 * GIB, 989e12, 3.35e12, "H100 SXM")
VLLM_LIMITS = Workload(prompt_tokens=1024, output_tokens=256, max_num_seqs=256, max_num_batched_tokens=8192)
LLAMA_3_8B = ModelShape.from_hf_config(
    {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
    },
    name="llama-3-8b",
)


def cluster(
    devices: int = 8,
    per_host: int = 8,
    *,
    device: DeviceSpec = H100,
    link: float = 450e9,
    latency: float = 10e-6,
) -> Cluster:
    return Cluster(device, devices, per_host, link, latency, 50e9, 25e-6)


def paper(name: str) -> tuple[ModelShape, partial[str]]:
    raw = json.loads((CONFIGS / f"{name}.json").read_text())
    return ModelShape.from_hf_config(raw, name=name), partial(check_sizes, ModelArchConfig.from_dict(raw))


def layout(plan: Plan) -> tuple[int, int, int]:
    return plan.tensor, plan.pipeline, plan.replicas


def test_the_public_api() -> None:
    assert sorted(parallel_plan.__all__) == sorted(
        ["PROFILES", "Alternative", "CanCut", "Cluster", "DeviceSpec", "Estimate", "ModelShape", "NoPlan",
         "Pins", "Plan", "Profile", "Split", "Workload", "any_cut", "choose", "split"]
    )  # fmt: skip
    assert parallel_plan.PROFILES == ("high_throughput", "low_latency")


def test_low_latency_on_a_fast_link_cuts_a_model_that_fits_one_device() -> None:
    plan = choose(LLAMA_3_8B, cluster(), profile="low_latency", workload=VLLM_LIMITS)
    assert layout(plan) == (8, 1, 1)
    assert plan.split.aggregated and plan.pinned == ()
    assert plan.explanation[0].startswith("lowest latency for the mean request: 1 x (TP 8 x PP 1)")
    assert plan.alternatives[0].rejected.startswith("slower: ")


def test_high_throughput_replicates_a_model_that_fits_one_device() -> None:
    plan = choose(LLAMA_3_8B, cluster(), profile="high_throughput", workload=VLLM_LIMITS)
    assert layout(plan) == (1, 1, 8)
    assert plan.split.aggregated
    assert plan.split.why.startswith("aggregated: a split adds no throughput")
    assert all(a.rejected.startswith("less throughput: ") for a in plan.alternatives)


def test_low_latency_on_a_slow_link_keeps_one_device() -> None:
    slow = cluster(link=10e9, latency=200e-6)  # no peer-to-peer: through host memory
    plan = choose(LLAMA_3_8B, slow, profile="low_latency", workload=VLLM_LIMITS)
    assert layout(plan) == (1, 1, 8)


def test_a_model_larger_than_a_device_is_split() -> None:
    shape, cut = paper("llama-3-70b")
    plan = choose(shape, cluster(), workload=VLLM_LIMITS, can_cut=cut)
    assert plan.tensor * plan.pipeline >= 2
    (alone,) = [a for a in plan.alternatives if (a.tensor, a.pipeline) == (1, 1)]
    assert alone.estimate is None and alone.replicas == 8
    assert alone.rejected == (
        "does not fit: 131.4 GiB of weights + 2.50 GiB of KV for one 8192-token sequence > 72.0 GiB usable a device"
    )


def test_no_layout_fits_raises_with_every_reason() -> None:
    shape, cut = paper("llama-3-70b")
    with pytest.raises(NoPlan) as e:
        choose(shape, cluster(2, device=dataclasses.replace(H100, memory_bytes=40 * GIB)), can_cut=cut)
    assert e.value.message == "llama-3-70b fits no layout of 2 devices"
    assert [(a.tensor, a.pipeline) for a in e.value.alternatives] == [(1, 1), (1, 2), (2, 1)]
    assert all(a.rejected.startswith("does not fit: ") for a in e.value.alternatives)


def test_tensor_parallel_stays_within_a_host() -> None:
    shape, cut = paper("llama-3-70b")
    small = dataclasses.replace(H100, memory_bytes=24 * GIB)  # 70B needs 8 of them
    plan = choose(
        shape, cluster(8, 4, device=small), profile="low_latency", workload=VLLM_LIMITS, can_cut=cut
    )
    assert layout(plan) == (4, 2, 1)  # the stages cross the hosts, the all-reduces do not
    (across,) = [a for a in plan.alternatives if a.tensor == 8]
    assert across.estimate is not None
    assert across.rejected == (
        "tensor parallel across hosts (T > 4 devices a host): all-reduces on the inter-host link"
    )


def test_tensor_parallel_crosses_hosts_when_nothing_else_fits() -> None:
    shape, _ = paper("llama-3-70b")
    small = dataclasses.replace(H100, memory_bytes=24 * GIB)
    one_stage = lambda t, p: "no stages" if p > 1 else ""  # noqa: E731
    plan = choose(shape, cluster(8, 4, device=small), profile="low_latency", can_cut=one_stage)
    assert layout(plan) == (8, 1, 1)
    assert plan.explanation[-1] == (
        "tensor parallel crosses hosts (no layout within one host fits): its all-reduces run on the inter-host link"
    )


def test_pins_are_honoured_and_said() -> None:
    plan = choose(LLAMA_3_8B, cluster(), profile="low_latency", workload=VLLM_LIMITS, pins=Pins(tensor=2))
    assert layout(plan) == (2, 1, 4)
    assert plan.pinned == ("tensor 2",) and plan.explanation[0] == "pinned: tensor 2"
    assert {a.tensor for a in plan.alternatives} == {2}
    plan = choose(LLAMA_3_8B, cluster(), workload=VLLM_LIMITS, pins=Pins(pipeline=1, replicas=2))
    assert layout(plan) == (4, 1, 2) and plan.pinned == ("pipeline 1", "replicas 2")


def test_a_pin_that_cannot_fit_is_refused() -> None:
    shape, cut = paper("llama-3-70b")
    with pytest.raises(NoPlan) as e:
        choose(shape, cluster(), can_cut=cut, pins=Pins(tensor=1, pipeline=1))
    assert [a.rejected[:13] for a in e.value.alternatives] == ["does not fit:"]
    with pytest.raises(ConfigError, match="need 16 devices, the cluster has 8"):
        choose(shape, cluster(), pins=Pins(tensor=8, replicas=2))
    with pytest.raises(ConfigError, match="must be >= 1"):
        choose(shape, cluster(), pins=Pins(tensor=0))
    with pytest.raises(ConfigError, match="'fastest' is not one of high_throughput, low_latency"):
        choose(shape, cluster(), profile="fastest")


def test_the_cut_rule_refuses_layouts() -> None:
    shape = dataclasses.replace(LLAMA_3_8B, heads=32)
    vllm_rule = lambda t, p: "" if 32 % t == 0 and t != 8 else f"{t} does not divide the heads"  # noqa: E731
    plan = choose(shape, cluster(), profile="low_latency", workload=VLLM_LIMITS, can_cut=vllm_rule)
    assert layout(plan) == (4, 1, 2)
    refused = {(a.tensor, a.pipeline): a.rejected for a in plan.alternatives if a.estimate is None}
    assert refused[(8, 1)] == "cannot cut: 8 does not divide the heads"
    assert refused[(3, 2)] == "cannot cut: 3 does not divide the heads"


def test_the_engine_rule_refuses_more_ranks_than_heads() -> None:
    raw = {
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "vocab_size": 49152,
        "tie_word_embeddings": True,
    }
    cpu = DeviceSpec(8 * GIB, 200e9, 20e9, "cpu core")
    plan = choose(
        ModelShape.from_hf_config(raw),
        cluster(16, 16, device=cpu, link=20e9, latency=20e-6),
        can_cut=partial(check_sizes, ModelArchConfig.from_dict(raw)),
    )
    refused = {(a.tensor, a.pipeline): a.rejected for a in plan.alternatives if a.estimate is None}
    assert refused[(10, 1)] == "cannot cut: tensor_parallel_size 10 exceeds the model's 9 attention heads"
    assert set(refused) == {
        (t, 1) for t in range(10, 17)
    }  # 9 ranks: 3 KV heads on 3 ranks each, one q head a rank


def test_low_latency_splits_prefill_from_decode_over_two_hosts() -> None:
    shape, cut = paper("llama-3-70b")
    plan = choose(shape, cluster(16), profile="low_latency", workload=VLLM_LIMITS, can_cut=cut)
    assert layout(plan) == (8, 1, 2)
    assert (plan.split.prefill, plan.split.decode) == (1, 1)
    assert plan.split.why.startswith("split: prefill takes 69% of an aggregated replica's time")
    assert round(plan.split.kv_transfer_s * 1e3, 1) == 6.7  # 1024 x 320 KiB over 50 GB/s
    assert plan.split.fleet_tokens_per_s < plan.estimate.fleet_tokens_per_s  # it pays in latency only
    plan = choose(shape, cluster(16), workload=VLLM_LIMITS, can_cut=cut)
    assert layout(plan) == (4, 1, 4) and plan.split.aggregated


# The paper cases: docs/partitioning.md states these figures and compares them with published recipes.


def test_paper_llama_3_70b_on_8_h100() -> None:
    shape, cut = paper("llama-3-70b")
    fast = choose(shape, cluster(), profile="low_latency", workload=VLLM_LIMITS, can_cut=cut)
    assert layout(fast) == (8, 1, 1)
    e = fast.estimate
    assert (round(e.itl_s * 1e3, 2), round(e.ttft_s * 1e3, 1), round(e.weights_per_device / GIB, 2)) == (
        6.89,
        30.5,
        16.43,
    )
    many = choose(shape, cluster(), profile="high_throughput", workload=VLLM_LIMITS, can_cut=cut)
    assert layout(many) == (4, 1, 2)
    e = many.estimate
    assert (e.batch, round(e.itl_s * 1e3, 2), round(e.step_s * 1e3, 2)) == (256, 12.17, 21.59)
    assert round(e.fleet_tokens_per_s) == 7573
    assert (
        many.explanation[1] == "next best: 1 x (TP 8 x PP 1), less throughput: 6,072 against 7,573 tokens/s"
    )


def test_paper_llama_3_70b_in_fp8_takes_the_fewest_devices_that_hold_it() -> None:
    shape, cut = paper("llama-3-70b")
    fp8 = dataclasses.replace(shape, bytes_per_param=1.0)
    assert layout(choose(fp8, cluster(), workload=VLLM_LIMITS, can_cut=cut)) == (2, 1, 4)
    assert layout(choose(fp8, cluster(), profile="low_latency", workload=VLLM_LIMITS, can_cut=cut)) == (
        8,
        1,
        1,
    )


def test_paper_mixtral_8x7b_on_8_h100() -> None:
    shape, cut = paper("mixtral-8x7b")
    many = choose(shape, cluster(), workload=VLLM_LIMITS, can_cut=cut)
    assert layout(many) == (2, 1, 4)
    e = many.estimate
    assert (e.batch, round(e.itl_s * 1e3, 2), round(e.fleet_tokens_per_s)) == (256, 4.51, 28925)
    fast = choose(shape, cluster(), profile="low_latency", workload=VLLM_LIMITS, can_cut=cut)
    assert layout(fast) == (8, 1, 1)
    assert round(fast.estimate.itl_s * 1e3, 2) == 1.61
    (alone,) = [a for a in many.alternatives if (a.tensor, a.pipeline) == (1, 1)]
    assert alone.rejected.startswith("does not fit: 87.0 GiB of weights")
