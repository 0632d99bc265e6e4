"""Interlock's configuration onto vLLM's engine arguments (no vLLM needed: the names are given)."""

from __future__ import annotations

import pytest

from interlock.engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from interlock.engine.vllm.args import OWNED, normalize, parse_engine_arg, vllm_engine_args
from interlock.errors import ConfigError

KNOWN = {
    "model", "tokenizer", "dtype", "block_size", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
    "enable_prefix_caching", "enable_chunked_prefill", "seed", "kv_cache_memory_bytes",
    "num_gpu_blocks_override", "enforce_eager", "gpu_memory_utilization", *OWNED,
}  # fmt: skip


def config(**engine_args):
    return EngineConfig(
        model=ModelConfig(model="/m", dtype="fp32", engine="vllm", engine_args=tuple(engine_args.items())),
        cache=CacheConfig(block_size=32, kv_cache_gib=0.5),
        scheduler=SchedulerConfig(max_model_len=1024, max_num_seqs=8, max_num_batched_tokens=512),
    )


def test_interlock_keys_map_to_vllms_names():
    args = vllm_engine_args(config(), KNOWN)
    assert args["model"] == "/m" and args["tokenizer"] == "/m"
    assert args["dtype"] == "float32"
    assert args["block_size"] == 32 and args["max_model_len"] == 1024
    assert args["max_num_seqs"] == 8 and args["max_num_batched_tokens"] == 512
    assert args["kv_cache_memory_bytes"] == 1 << 29
    assert "num_gpu_blocks_override" not in args


def test_engine_args_pass_through_and_win():
    args = vllm_engine_args(config(enforce_eager=True, max_model_len=2048, num_gpu_blocks_override=64), KNOWN)
    assert args["enforce_eager"] is True and args["max_model_len"] == 2048
    assert args["num_gpu_blocks_override"] == 64 and "kv_cache_memory_bytes" not in args


@pytest.mark.parametrize("key", sorted(OWNED))
def test_what_the_worker_owns_is_refused_by_name(key):
    with pytest.raises(ConfigError, match=f"engine_args.{key}"):
        vllm_engine_args(config(**{key: 1}), KNOWN)


def test_an_unknown_argument_is_refused_with_a_suggestion():
    with pytest.raises(ConfigError, match="enforce_eagre.*did you mean enforce_eager"):
        vllm_engine_args(config(enforce_eagre=True), KNOWN)


def test_engine_args_need_the_vllm_engine():
    with pytest.raises(ConfigError, match="need engine vllm"):
        ModelConfig(engine_args=(("enforce_eager", True),))
    with pytest.raises(ConfigError, match="engine 'sglang'"):
        ModelConfig(engine="sglang")


@pytest.mark.parametrize(
    ("item", "parsed"),
    [
        ("enforce_eager=true", ("enforce_eager", True)),
        ("--max-num-seqs=4", ("max_num_seqs", 4)),
        ("enforce-eager", ("enforce_eager", True)),
        ("kv_cache_dtype=fp8", ("kv_cache_dtype", "fp8")),
        ('compilation_config={"mode": 0}', ("compilation_config", {"mode": 0})),
    ],
)
def test_command_line_items(item, parsed):
    assert parse_engine_arg(item) == parsed


def test_a_key_given_twice_is_refused():
    with pytest.raises(ConfigError, match="given twice"):
        normalize([("enforce-eager", True), ("enforce_eager", False)])
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_engine_arg("=3")


def test_the_seed_is_fresh_unless_configured():
    fresh = {vllm_engine_args(config(), KNOWN)["seed"] for _ in range(4)}
    assert len(fresh) > 1 and all(0 <= s < 2**32 for s in fresh)
    seeded = EngineConfig(model=ModelConfig(model="/m", engine="vllm", seed=5))
    assert vllm_engine_args(seeded, KNOWN)["seed"] == 5
