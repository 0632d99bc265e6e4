"""partition: every rank's share of a model's heads, features and layers."""

from __future__ import annotations

import dataclasses

import pytest

from interlock.engine.model.config import ModelArchConfig, RopeScaling
from interlock.engine.model.partition import check_sizes, partition
from interlock.errors import ConfigError

SMOL = ModelArchConfig(
    architecture="LlamaForCausalLM",
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_layers=30,
    num_heads=9,
    num_kv_heads=3,
    head_dim=64,
    rms_norm_eps=1e-5,
    rope_theta=100000.0,
    rope_scaling=RopeScaling(),
    max_position_embeddings=8192,
    tie_word_embeddings=True,
    qkv_bias=False,
    eos_token_ids=(2,),
)


def _covers(parts: list[range], n: int) -> bool:
    return [i for r in parts for i in r] == list(range(n))


@pytest.mark.parametrize(("tensor", "pipeline"), [(1, 1), (2, 1), (1, 2), (2, 2), (3, 1), (3, 10), (1, 30)])
def test_each_stage_covers_the_model_once(tensor: int, pipeline: int) -> None:
    shards = partition(SMOL, tensor, pipeline)
    assert [s.rank for s in shards] == list(range(tensor * pipeline))
    assert _covers([shards[s * tensor].layers for s in range(pipeline)], SMOL.num_layers)
    for s in range(pipeline):
        stage = shards[s * tensor : (s + 1) * tensor]
        assert {r.stage for r in stage} == {s} and [r.tensor_rank for r in stage] == list(range(tensor))
        assert _covers([r.q_heads for r in stage], SMOL.num_heads)
        assert _covers([r.intermediate for r in stage], SMOL.intermediate_size)
        assert all(r.layers == stage[0].layers for r in stage)


def test_heads_follow_their_kv_groups_unevenly_where_ranks_do_not_divide() -> None:
    first, second = partition(SMOL, 2, 1)
    assert (first.q_heads, first.kv_heads) == (range(0, 3), range(0, 1))  # the driver: the lighter share
    assert (second.q_heads, second.kv_heads) == (range(3, 9), range(1, 3))
    assert (first.intermediate, second.intermediate) == (range(0, 768), range(768, 1536))
    local = second.local_config(SMOL)
    assert (local.num_heads, local.num_kv_heads, local.intermediate_size, local.num_layers) == (6, 2, 768, 30)
    assert local.num_heads // local.num_kv_heads == 3 and local.vocab_size == SMOL.vocab_size


def test_more_ranks_than_kv_heads_replicate_a_kv_head_and_split_its_q_heads() -> None:
    shards = partition(SMOL, 4, 1)
    assert [(s.q_heads, s.kv_heads) for s in shards] == [
        (range(0, 2), range(0, 1)),
        (range(2, 3), range(0, 1)),
        (range(3, 6), range(1, 2)),
        (range(6, 9), range(2, 3)),
    ]
    # Every rank's q heads read the one KV head it holds.
    for s in shards:
        assert all(q // 3 == s.kv_heads.start for q in s.q_heads)


def test_features_are_cut_in_sixteens_where_they_can_be() -> None:
    odd = dataclasses.replace(SMOL, intermediate_size=1552)  # 97 sixteens
    cuts = [s.intermediate for s in partition(odd, 3, 1)]
    assert [len(c) for c in cuts] == [528, 512, 512] and all(c.start % 16 == 0 for c in cuts)


@pytest.mark.parametrize(
    ("tensor", "pipeline", "why"),
    [
        (10, 1, "exceeds the model's 9 attention heads"),
        (1, 31, "exceeds the model's 30 layers"),
        (0, 1, "must be >= 1"),
        (8, 9, "at most 64"),
    ],
)
def test_cuts_that_cannot_be_made_are_refused_with_the_reason(tensor: int, pipeline: int, why: str) -> None:
    assert why in check_sizes(SMOL, tensor, pipeline)
    with pytest.raises(ConfigError, match=why):
        partition(SMOL, tensor, pipeline)
