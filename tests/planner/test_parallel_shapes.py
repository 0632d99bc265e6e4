"""Model shapes read from config.json (parameter counts match the published ones), devices, hosts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from interlock.planner.parallel_shapes import Cluster, DeviceSpec, ModelShape, Workload

CONFIGS = Path(__file__).parents[2] / "examples" / "configs"
SMOLLM2 = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
    "dtype": "bfloat16",
}


def config(name: str) -> dict[str, object]:
    return json.loads((CONFIGS / f"{name}.json").read_text())


def test_smollm2_has_its_published_parameter_count() -> None:
    s = ModelShape.from_hf_config(SMOLLM2)
    assert s.parameters == 134_515_008
    assert s.kv_bytes_per_token == 2 * 30 * 3 * 64 * 2
    assert (s.bytes_per_param, s.activation_bytes, s.context_length) == (2.0, 2, 8192)
    assert s.bytes_read(1) == s.weight_bytes and s.active_parameters == s.parameters


def test_llama_3_70b_from_its_config() -> None:
    s = ModelShape.from_hf_config(config("llama-3-70b"))
    assert s.parameters == 70_553_706_496
    assert s.kv_bytes_per_token == 327_680  # 320 KiB: 80 layers x 8 KV heads x 128 x K,V x bf16
    assert (s.layers, s.heads, s.kv_heads, s.head_dim, s.experts) == (80, 64, 8, 128, 0)


def test_mixtral_reads_all_experts_for_memory_and_two_for_compute() -> None:
    s = ModelShape.from_hf_config(config("mixtral-8x7b"))
    assert s.parameters == 46_702_792_704
    assert (s.experts, s.active_experts, s.expert_intermediate) == (8, 2, 14336)
    assert s.expert_parameters == 32 * 8 * 3 * 4096 * 14336
    assert round(s.active_parameters / 1e9, 2) == 12.88
    dense = s.parameters - s.expert_parameters
    assert s.bytes_read(1) == (dense + s.expert_parameters / 4) * 2
    assert s.bytes_read(64) == pytest.approx(s.weight_bytes, rel=1e-7)  # every expert touched


def test_qwen_moe_spelling_with_a_shared_expert() -> None:
    raw = {
        **SMOLLM2,
        "num_experts": 4,
        "num_experts_per_tok": 1,
        "moe_intermediate_size": 128,
        "shared_expert_intermediate_size": 256,
    }
    s = ModelShape.from_hf_config(raw)
    assert (s.experts, s.active_experts, s.expert_intermediate) == (4, 1, 128)
    mlp = 4 * 3 * 576 * 128 + 576 * 4 + 3 * 576 * 256
    assert s.parameters == 49152 * 576 + 30 * (884_736 + mlp + 1152) + 576


def test_latent_attention_and_bad_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="MLA"):
        ModelShape.from_hf_config({**SMOLLM2, "kv_lora_rank": 512})
    with pytest.raises(ValueError, match="active_experts"):
        ModelShape(1, 1, 1, 1, 1, 1, 1, 1, 1, experts=4, active_experts=5, expert_intermediate=1)
    with pytest.raises(ValueError):
        Workload(prompt_tokens=0)


def test_fp32_configs_keep_fp32_activations_and_kv() -> None:
    s = ModelShape.from_hf_config({**SMOLLM2, "dtype": "float32"})
    assert (s.bytes_per_param, s.activation_bytes, s.kv_bytes_per_token) == (4.0, 4, 2 * 30 * 3 * 64 * 4)


def cluster(devices: int, per_host: int) -> Cluster:
    return Cluster(DeviceSpec(1 << 30, 1e12, 1e12), devices, per_host, 100e9, 1e-5, 10e9, 5e-5)


def test_groups_stay_within_hosts_until_they_cannot() -> None:
    c = cluster(16, 8)
    assert c.hosts == 2
    assert [c.groups(n) for n in (1, 2, 3, 4, 5, 8, 16)] == [16, 8, 4, 4, 2, 2, 1]
    assert cluster(10, 4).groups(3) == 2  # hosts of 4, 4, 2: a group of 3 in each full host, none in the last
    assert c.link(8) == (100e9, 1e-5) and c.link(9) == (10e9, 5e-5)
