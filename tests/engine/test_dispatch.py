"""The per-step kernel choice for attention and the element-wise kernels (issue 11): decisions
from a table, the split of a step between the fused kernel and PyTorch's attention, and each
implementation against the reference on the shapes it may be given."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from interlock.engine.model import SequenceChunk, build_input, cpu_ops
from interlock.engine.model.batch import split_attention
from interlock.engine.model.config import ModelArchConfig
from interlock.engine.model.dispatch import (
    DECODE_CONTEXTS,
    AttentionRoute,
    ElementwisePlans,
    TorchKernels,
    attend,
    decode_key,
    elementwise_keys,
    kernel_table,
    model_ops,
    prefill_key,
)
from interlock.engine.model.kernel_choice import KernelTable, Plan
from interlock.engine.model.rope import apply_rotary
from interlock.errors import ConfigError
from tests.engine.test_cpu_ops import reference_attention

BF16 = torch.bfloat16
FUSED = cpu_ops.cpu_supports_bf16_kernels()
needs_kernels = pytest.mark.skipif(not FUSED, reason="this CPU has no AVX-512 BF16; the plain path is used")


def _config(heads: int = 9, kv_heads: int = 3, dim: int = 64) -> ModelArchConfig:
    return ModelArchConfig.from_dict(
        {
            "num_attention_heads": heads,
            "num_key_value_heads": kv_heads,
            "head_dim": dim,
            "hidden_size": 576,
            "intermediate_size": 1536,
            "num_hidden_layers": 1,
            "vocab_size": 100,
        }
    )


def _table(c: ModelArchConfig) -> KernelTable:
    plans = {
        decode_key(c, DECODE_CONTEXTS[0]): Plan((8, 4096), ("fused", "torch")),
        decode_key(c, DECODE_CONTEXTS[1]): Plan.only("fused"),
        prefill_key(c): Plan((128, 4096), ("fused", "torch")),
    }
    return KernelTable("test", plans, {})


def test_the_route_decides_from_the_table_alone() -> None:
    c = _config()
    route = AttentionRoute.from_table(_table(c), c)
    assert route is not None
    # Decode: by batch, in the context class nearest the longest context.
    assert [route.decode_impl(b, 200) for b in (1, 8, 9, 64)] == ["fused", "fused", "torch", "torch"]
    assert [route.decode_impl(b, 1500) for b in (1, 9, 64)] == ["fused"] * 3
    # Prefill: by chunk length.
    assert [route.prefill_impl(n) for n in (2, 128, 129, 2048)] == ["fused", "fused", "torch", "torch"]
    # The same table decides the same, read back from its JSON.
    again = AttentionRoute.from_table(KernelTable.from_json(_table(c).to_json()), c)
    assert again == route
    # Fused everywhere (or no table): no route, no per-step work.
    assert AttentionRoute.from_table(KernelTable("t", {}, {}), c) is None
    assert AttentionRoute.from_table(None, c) is None


def test_elementwise_plans_pick_per_rows() -> None:
    c = _config()
    norm, _swiglu, _rope = elementwise_keys(c)
    plans = ElementwisePlans.from_table(KernelTable("t", {norm: Plan((4, 4096), ("torch", "fused"))}, {}), c)
    ops = SimpleNamespace(
        rms_norm="fused norm", add_rms_norm="fused add", silu_mul="fused swiglu", rope_write_kv="fused rope"
    )
    assert plans.kernels(ops, 4) == (
        TorchKernels.rms_norm,
        TorchKernels.add_rms_norm,
        "fused swiglu",
        "fused rope",
    )
    assert plans.kernels(ops, 5) == ("fused norm", "fused add", "fused swiglu", "fused rope")
    assert ElementwisePlans.from_table(None, c) == ElementwisePlans(
        Plan.only("fused"), Plan.only("fused"), Plan.only("fused")
    )


def _chunks() -> list[SequenceChunk]:
    """Two decode rows, a fresh prompt, a chunk after a prefix (blocks of 16)."""
    return [
        SequenceChunk([1], 20, [0, 1]),
        SequenceChunk(list(range(30)), 0, [2, 3]),
        SequenceChunk([2], 40, [4, 5, 6]),
        SequenceChunk(list(range(17)), 16, [7, 8, 9]),
    ]


def test_split_moves_the_chosen_parts_to_the_plain_fields() -> None:
    meta = build_input(_chunks(), 16, torch.device("cpu"), fused=True).meta
    assert split_attention(meta, 16, plain_decode=False, plain_prefill=[False, False]) is meta
    split = split_attention(meta, 16, plain_decode=True, plain_prefill=[False, True])
    assert split.seq_info is not None and split.seq_info.tolist() == [[2, 30, 0]]
    assert split.block_tables is not None and split.block_tables.tolist()[0][:2] == [2, 3]
    assert split.num_decode == 2 and split.decode_block_table is not None
    assert [(s.start, s.end, s.start_pos) for s in split.prefills] == [(32, 49, 16)]
    # Everything plain: no sequence left for the fused kernel.
    none = split_attention(meta, 16, plain_decode=True, plain_prefill=[True, True])
    assert none.seq_info is not None and none.seq_info.shape[0] == 0 and len(none.prefills) == 2


@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(9, 3, 64), (16, 2, 128)])
@pytest.mark.parametrize(
    ("plain_decode", "plain_prefill"),
    [(False, [False, False]), (True, [True, True]), (True, [False, True]), (False, [True, False])],
)
def test_attend_agrees_with_the_reference_however_the_step_is_split(
    heads: int, kv_heads: int, dim: int, plain_decode: bool, plain_prefill: list[bool]
) -> None:
    if not FUSED and not (plain_decode and all(plain_prefill)):
        pytest.skip("the fused attention needs AVX-512 BF16")
    c = _config(heads, kv_heads, dim)
    gen = torch.Generator().manual_seed(dim + sum(plain_prefill))
    chunks = _chunks()
    blocks = torch.randn(2, kv_heads, 10, 16, dim, generator=gen).to(BF16)
    rows = sum(len(ch.token_ids) for ch in chunks)
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * dim, generator=gen)
    qkv[:, : heads * dim] *= dim**-0.5  # the model folds the scale into q (scores in bf16 stay small)
    qkv = qkv.to(BF16)
    meta = build_input(chunks, 16, torch.device("cpu"), fused=True).meta
    # What rope_write_kv leaves behind: this step's k and v stored in their slots.
    flat = blocks.view(2, kv_heads, -1, dim)
    k = qkv[:, heads * dim : (heads + kv_heads) * dim].view(rows, kv_heads, dim)
    v = qkv[:, (heads + kv_heads) * dim :].view(rows, kv_heads, dim)
    flat[0].index_copy_(1, meta.slot_mapping, k.transpose(0, 1))
    flat[1].index_copy_(1, meta.slot_mapping, v.transpose(0, 1))
    split = split_attention(meta, 16, plain_decode=plain_decode, plain_prefill=plain_prefill)
    got = attend(cpu_ops.load(), qkv, split, blocks, c)
    expected, row = [], 0
    for ch in [chunks[0], chunks[2], chunks[1], chunks[3]]:  # decode rows first
        n = len(ch.token_ids)
        context = ch.start_pos + n
        kv = blocks[:, :, list(ch.block_table)].reshape(2, kv_heads, -1, dim)[:, :, :context]
        expected.append(
            reference_attention(
                qkv[row : row + n, : heads * dim].view(n, heads, dim), kv[0], kv[1], ch.start_pos
            )
        )
        row += n
    reference = torch.cat(expected)
    assert (got.float() - reference).abs().max() < 0.02 * max(1.0, float(reference.abs().max()))


def test_torch_rotary_matches_the_reference_and_stores_k_and_v() -> None:
    heads, kv_heads, dim, n = 9, 3, 64, 20
    gen = torch.Generator().manual_seed(1)
    angles = torch.randn(600, dim // 2, generator=gen)
    cos = torch.cat([angles.cos(), angles.cos()], -1)
    sin = torch.cat([-angles.sin(), angles.sin()], -1)
    qkv = torch.randn(n, (heads + 2 * kv_heads) * dim, generator=gen).to(BF16)
    positions = torch.randint(0, 600, (n,), generator=gen)
    slots = torch.randperm(256, generator=gen)[:n]
    cache = torch.zeros(2, kv_heads, 256, dim, dtype=BF16)
    width = (heads + kv_heads) * dim
    expected = apply_rotary(
        qkv[:, :width].view(n, -1, dim).float(), cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)
    ).to(BF16)
    values = qkv[:, width:].clone()
    TorchKernels.rope_write_kv(qkv, positions, cos, sin, cache, slots, heads, kv_heads)
    assert torch.equal(qkv[:, :width].view(n, -1, dim), expected)
    assert torch.equal(cache[0][:, slots].transpose(0, 1), expected[:, heads:])
    assert torch.equal(cache[1][:, slots].transpose(0, 1).reshape(n, -1), values)
    if FUSED:  # the fused kernel: within one bf16 rounding of it
        again = torch.randn(n, (heads + 2 * kv_heads) * dim, generator=gen).to(BF16)
        a, b = again.clone(), again.clone()
        ops: Any = cpu_ops.load()
        ops.rope_write_kv(a, positions, cos, sin, cache.clone(), slots, heads, kv_heads)
        TorchKernels.rope_write_kv(b, positions, cos, sin, cache.clone(), slots, heads, kv_heads)
        assert ((a.float() - b.float()).abs() <= b.float().abs() * 2**-7 + 1e-6).all()


@needs_kernels
@pytest.mark.parametrize("rows", [1, 7, 64])
def test_torch_norms_and_swiglu_are_bit_identical_to_the_fused_ones(rows: int) -> None:
    ops: Any = cpu_ops.load()
    gen = torch.Generator().manual_seed(rows)
    h, delta = (torch.randn(rows, 576, generator=gen).to(BF16) for _ in range(2))
    w = torch.randn(576, generator=gen).to(BF16)
    assert torch.equal(TorchKernels.rms_norm(h, w, 1e-5), ops.rms_norm(h, w, 1e-5))
    h1, h2 = h.clone(), h.clone()
    assert torch.equal(TorchKernels.add_rms_norm(h1, delta, w, 1e-5), ops.add_rms_norm(h2, delta, w, 1e-5))
    assert torch.equal(h1, h2)
    x = (torch.randn(rows, 2 * 1536, generator=gen) * 4).to(BF16)
    assert torch.equal(TorchKernels.silu_mul(x), ops.silu_mul(x))


def test_unknown_kernel_names_are_refused_and_forcing_measures_nothing() -> None:
    c = _config()
    cpu = torch.device("cpu")
    with pytest.raises(ConfigError, match="elementwise kernel 'fast'"):
        kernel_table(c, BF16, cpu, fused=True, kernels={"elementwise": "fast"}, max_rows=64)
    with pytest.raises(ConfigError, match="kernel family 'mlp'"):
        kernel_table(c, BF16, cpu, fused=True, kernels={"mlp": "torch"}, max_rows=64)
    forced = kernel_table(
        c,
        BF16,
        cpu,
        fused=True,
        max_rows=64,
        kernels={"linear": "onednn", "attention": "torch", "elementwise": "fused"},
    )
    assert forced is not None and forced.machine == "forced" and not forced.timings
    assert {key: plan.impls for key, plan in forced.plans.items()} == {
        op.key: ("onednn",)
        if op.key.startswith("linear")
        else ("torch",)
        if op.key.startswith("attention")
        else ("fused",)
        for op in model_ops(c, 64)
    }
    # The plain path (fp16: no fused library; fp32 on a CPU without AVX2) has nothing to choose.
    assert kernel_table(c, torch.float16, cpu, fused=True, kernels={}, max_rows=64) is None
    if cpu_ops.load_f32() is None:
        assert kernel_table(c, torch.float32, cpu, fused=True, kernels={}, max_rows=64) is None


@needs_kernels
def test_every_measured_candidate_runs_at_the_smallest_and_largest_size() -> None:
    """The measurement's calls themselves (what ``doctor kernels`` times), for a tiny model."""
    c = _config(4, 2, 64)
    for op in model_ops(c, 16):
        for size in (op.sizes[0], op.sizes[-1]):
            calls = op.calls(size)
            assert set(calls) >= {"fused", "torch"} or op.key.startswith("linear")
            for fn in calls.values():
                fn()


def test_a_model_the_fused_layers_do_not_take_measures_its_linear_layers_only() -> None:
    keys = [op.key for op in model_ops(_config(8, 8, 80), 64)]
    assert keys and all(key.startswith("linear ") for key in keys)
    assert any(key.startswith("attention") for key in (op.key for op in model_ops(_config(), 64)))
