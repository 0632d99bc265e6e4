"""The roofline: decode bound by bytes, the price of all-reduces and stages, the KV budget."""

from __future__ import annotations

import pytest

from interlock.planner.parallel_cost import allreduce_s, estimate, kv_budget, kv_share, pass_s
from interlock.planner.parallel_shapes import GIB, Cluster, DeviceSpec, ModelShape, Workload

# 1e9 parameters in bf16 (2 GB), 10 layers, 2 KV heads of 100: 8,000 bytes of KV a token.
SHAPE = ModelShape(
    parameters=10**9, layers=10, hidden=1000, intermediate=4000, heads=10, kv_heads=2, head_dim=100,
    vocab=1000, context_length=1000,
)  # fmt: skip
LINK, LATENCY = 100e9, 10e-6
CLUSTER = Cluster(DeviceSpec(10 * GIB, 1e15, 1e12), 8, 8, LINK, LATENCY, 10e9, 50e-6)


def test_decode_alone_reads_every_weight_and_its_kv() -> None:
    assert SHAPE.kv_bytes_per_token == 8000
    itl = pass_s(SHAPE, CLUSTER, 1, 1, seqs=1, new=1, context=999)
    assert itl == pytest.approx((2e9 + 1000 * 8000) / 1e12, rel=1e-6)  # compute is 2 GFLOP: 2 us


def test_tensor_parallel_halves_the_bytes_and_pays_two_all_reduces_a_layer() -> None:
    one = pass_s(SHAPE, CLUSTER, 1, 1, seqs=1, new=1, context=999)
    two = pass_s(SHAPE, CLUSTER, 2, 1, seqs=1, new=1, context=999)
    reduce = LATENCY + 2 * (1 / 2) * 1000 * 2 / LINK  # one row of 1000 bf16 values, ring of 2
    assert allreduce_s(CLUSTER, 2, 2000) == pytest.approx(reduce)
    assert two == pytest.approx(one / 2 + 2 * 10 * reduce, rel=1e-6)
    assert allreduce_s(CLUSTER, 1, 2000) == 0.0


def test_stages_give_one_sequence_no_speed_and_a_batch_a_bubble() -> None:
    hop = LATENCY + 2000 / LINK
    one = pass_s(SHAPE, CLUSTER, 1, 1, seqs=1, new=1, context=0)
    staged = pass_s(SHAPE, CLUSTER, 1, 2, seqs=1, new=1, context=0)
    assert staged == pytest.approx(one + 2 * hop, rel=1e-6)  # two stages of half the layers, in turn
    # two sequences, two micro-batches: three stage times, each reading the stage's weights again
    stage = pass_s(SHAPE, CLUSTER, 1, 2, seqs=1, new=1, context=0) / 2
    assert pass_s(SHAPE, CLUSTER, 1, 2, seqs=2, new=1, context=0) == pytest.approx(3 * stage, rel=1e-3)


def test_a_long_prefill_is_bound_by_compute() -> None:
    t = pass_s(SHAPE, CLUSTER, 1, 1, seqs=1, new=1000, context=0)
    flops = 2 * 1e9 * 1000 + 4 * 10 * 10 * 100 * 1000 * 500
    assert t == pytest.approx(flops / 1e15, rel=1e-6)


def test_kv_heads_are_cut_as_the_engine_cuts_them() -> None:
    smol = ModelShape(1, 30, 576, 1536, 9, 3, 64, 49152, 8192)
    assert kv_share(smol, 1, 1) == 1
    assert kv_share(smol, 2, 1) == pytest.approx(2 / 3)  # 2 + 1 heads: the busier rank holds 2
    assert kv_share(smol, 6, 1) == pytest.approx(1 / 3)  # one head each, replicated
    assert kv_share(smol, 3, 2) == pytest.approx(1 / 6)


def test_kv_budget_needs_one_full_length_sequence() -> None:
    left, why = kv_budget(SHAPE, CLUSTER, 1, 1)
    assert why == "" and left == pytest.approx(9 * GIB - 2e9)
    tight = Cluster(DeviceSpec(int(2.2e9), 1e15, 1e12), 8, 8, LINK, LATENCY, 10e9, 50e-6)
    left, why = kv_budget(SHAPE, tight, 1, 1)
    assert why == (
        "does not fit: 1.9 GiB of weights + 0.01 GiB of KV for one 1000-token sequence "
        "> 1.8 GiB usable a device"
    )
    assert kv_budget(SHAPE, tight, 2, 1)[1] == ""


def test_estimate_batches_what_the_kv_budget_holds() -> None:
    w = Workload(prompt_tokens=100, output_tokens=100, max_num_seqs=10_000, max_num_batched_tokens=1000)
    e = estimate(SHAPE, CLUSTER, 1, 1, 3, w)
    assert e.kv_tokens == int((9 * GIB - 2e9) / 8000)
    assert e.batch == e.kv_tokens // 200
    assert e.itl_s == pass_s(SHAPE, CLUSTER, 1, 1, seqs=1, new=1, context=150)
    assert e.ttft_s == pass_s(SHAPE, CLUSTER, 1, 1, seqs=1, new=100, context=0)
    assert e.latency_s == pytest.approx(e.ttft_s + 100 * e.itl_s)
    request_s = 100 / e.prefill_tokens_per_s + 100 * e.step_s / e.batch
    assert e.fleet_tokens_per_s == pytest.approx(3 * 100 / request_s)
    assert e.prefill_share == pytest.approx(100 / e.prefill_tokens_per_s / request_s)
    assert estimate(SHAPE, CLUSTER, 1, 1, 1, Workload(100, 100, 4, 1000)).batch == 4  # max_num_seqs caps it
