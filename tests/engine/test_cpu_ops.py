"""The fused bf16 CPU kernels against the plain PyTorch functions they replace.

Element-wise kernels (RMSNorm, residual add, SwiGLU) are bit-identical to PyTorch's bf16
recipe; rotary embedding is computed in fp32 and rounded once (within one bf16 rounding of
PyTorch's); paged attention is compared with an fp32 softmax(QK^T)V over the gathered
blocks, within bf16 rounding of the inputs. The model-level tests run the same steps through
the fused and the plain path. Skipped, with the reason, on a CPU without AVX-512 BF16.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from interlock.engine.model import LlamaModel, PagedKVCache, SequenceChunk, build_input, cpu_ops
from interlock.engine.model.kernel_choice import KernelTable, Plan
from interlock.engine.model.linear import Linear
from interlock.engine.model.rope import apply_rotary
from interlock.model_store import resolve_model

BF16 = torch.bfloat16
pytestmark = pytest.mark.skipif(
    not cpu_ops.cpu_supports_bf16_kernels(), reason="this CPU has no AVX-512 BF16; the plain path is used"
)


@pytest.fixture(scope="module")
def ops() -> object:
    loaded = cpu_ops.load()
    assert loaded is not None, "the CPU supports the kernels, so they must build and load"
    return loaded


def _norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)).to(BF16)


def test_norms_and_swiglu_are_bit_identical_to_pytorch(ops: object) -> None:
    gen = torch.Generator().manual_seed(0)
    x, h, delta = (torch.randn(37, 576, generator=gen).to(BF16) for _ in range(3))
    w = torch.randn(576, generator=gen).to(BF16)
    assert torch.equal(ops.rms_norm(x, w, 1e-5), _norm(x, w))  # type: ignore[attr-defined]
    residual = h.clone()
    out = ops.add_rms_norm(residual, delta, w, 1e-5)  # type: ignore[attr-defined]
    assert torch.equal(residual, h + delta) and torch.equal(out, _norm(h + delta, w))
    gate_up = (torch.randn(9, 2 * 1536, generator=gen) * 4).to(BF16)
    expected = torch.nn.functional.silu(gate_up[:, :1536]) * gate_up[:, 1536:]
    assert torch.equal(ops.silu_mul(gate_up), expected)  # type: ignore[attr-defined]


@pytest.mark.parametrize("rows", [1, 3, 8, 13, 40])
@pytest.mark.parametrize(("features", "inputs", "bias"), [(48, 64, False), (96, 576, True)])
def test_small_batch_linear_equals_f_linear(
    ops: object, rows: int, features: int, inputs: int, bias: bool
) -> None:
    """Row tails (not a multiple of 8), an odd number of 16-feature blocks, a bias."""
    gen = torch.Generator().manual_seed(rows)
    w = torch.randn(features, inputs, generator=gen).to(BF16)
    b = torch.randn(features, generator=gen).to(BF16) if bias else None
    x = torch.randn(rows, inputs, generator=gen).to(BF16)
    packed = ops.pack_linear_weight(w)  # type: ignore[attr-defined]
    got = ops.linear_small(x, packed, b).float()  # type: ignore[attr-defined]
    expected = torch.nn.functional.linear(x.float(), w.float(), None if b is None else b.float())
    # fp32 sums in another order, one bf16 rounding: within 2^-8 of the largest output.
    assert (got - expected).abs().max() <= expected.abs().max() * 2**-8
    linear = Linear(w, b)
    assert linear.small is not None and torch.equal(linear.plain_weight(), w)
    assert torch.equal(linear(x), ops.linear_small(x, packed, b))  # type: ignore[attr-defined]


def test_rope_rotates_q_and_k_in_place_and_stores_k_and_v(ops: object) -> None:
    heads, kv_heads, dim, n = 9, 3, 64, 20
    gen = torch.Generator().manual_seed(1)
    cos, sin = torch.randn(2, 600, dim, generator=gen)
    qkv = torch.randn(n, (heads + 2 * kv_heads) * dim, generator=gen).to(BF16)
    positions = torch.randint(0, 600, (n,), generator=gen)
    slots = torch.randperm(256, generator=gen)[:n]
    cache = torch.zeros(2, kv_heads, 256, dim, dtype=BF16)
    expected = apply_rotary(
        qkv[:, : (heads + kv_heads) * dim].view(n, -1, dim).float(),
        cos[positions].unsqueeze(1),
        sin[positions].unsqueeze(1),
    )
    values = qkv[:, (heads + kv_heads) * dim :].view(n, kv_heads, dim).clone()
    ops.rope_write_kv(qkv, positions, cos, sin, cache, slots, heads, kv_heads)  # type: ignore[attr-defined]
    rotated = qkv[:, : (heads + kv_heads) * dim].view(n, -1, dim).float()
    # One bf16 rounding of the result (relative 2^-8), with slack for the input's magnitude.
    assert ((rotated - expected).abs() <= expected.abs() * 2**-8 + 1e-2).all()
    assert torch.equal(
        cache[0][:, slots].transpose(0, 1),
        qkv[:, heads * dim : (heads + kv_heads) * dim].view(n, kv_heads, dim),
    )
    assert torch.equal(cache[1][:, slots].transpose(0, 1), values)


def reference_attention(q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, start: int) -> torch.Tensor:
    """fp32 softmax(QK^T)V with the causal mask offset by ``start`` cached tokens."""
    n, heads, dim = q.shape
    group = heads // key.shape[0]
    k, v = key.float().repeat_interleave(group, 0), value.float().repeat_interleave(group, 0)
    scores = torch.einsum("nhd,hcd->hnc", q.float(), k)
    allowed = torch.arange(key.shape[1]) <= torch.arange(start, start + n).unsqueeze(1)
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    return torch.einsum("hnc,hcd->nhd", probs, v).reshape(n, heads * dim)


PAGED_SHAPES = [(9, 3, 64, 16), (4, 4, 64, 32), (16, 2, 128, 16)]
PAGED_CHUNKS = [([1, 1, 1, 1], [0, 15, 16, 200]), ([300], [0]), ([130, 1, 20, 17], [37, 5, 0, 16])]
"""Decode rows, a long prompt, chunks after a prefix, block boundaries (each case one call)."""


def paged_case(
    heads: int,
    kv_heads: int,
    dim: int,
    block_size: int,
    lengths: list[int],
    starts: list[int],
    dtype: torch.dtype,
    scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(qkv, cache, seq_info, block_tables, expected output) of one paged-attention call in
    ``dtype``: the sequences' blocks scattered over the cache, the expected output computed in
    fp32 from the gathered keys."""
    gen = torch.Generator().manual_seed(len(lengths) * dim + block_size)
    num_blocks = 64
    cache = (torch.randn(2, kv_heads, num_blocks, block_size, dim, generator=gen) * scale).to(dtype)
    total = sum(lengths)
    qkv = (torch.randn(total, (heads + 2 * kv_heads) * dim, generator=gen) * scale).to(dtype)
    q = qkv[:, : heads * dim].view(total, heads, dim)
    free = torch.randperm(num_blocks, generator=gen).tolist()
    width = max((s + n + block_size - 1) // block_size for n, s in zip(lengths, starts, strict=True))
    info, tables, expected, row = [], [], [], 0
    for n, start in zip(lengths, starts, strict=True):
        count = (start + n + block_size - 1) // block_size
        blocks, free = free[:count], free[count:]
        info.append([row, n, start])
        tables.append(blocks + [0] * (width - count))
        kv = cache[:, :, blocks].reshape(2, kv_heads, count * block_size, dim)[:, :, : start + n]
        expected.append(reference_attention(q[row : row + n], kv[0], kv[1], start))
        row += n
    return qkv, cache, torch.tensor(info), torch.tensor(tables), torch.cat(expected)


@pytest.mark.parametrize(("heads", "kv_heads", "dim", "block_size"), PAGED_SHAPES)
@pytest.mark.parametrize(("lengths", "starts"), PAGED_CHUNKS)
def test_paged_attention_matches_softmax_attention_over_the_blocks(
    ops: object, heads: int, kv_heads: int, dim: int, block_size: int, lengths: list[int], starts: list[int]
) -> None:
    qkv, cache, info, tables, reference = paged_case(heads, kv_heads, dim, block_size, lengths, starts, BF16)
    out = torch.empty(qkv.shape[0], heads * dim, dtype=BF16)
    ops.paged_attention(qkv, cache, info, tables, heads, kv_heads, out)  # type: ignore[attr-defined]
    # bf16 output (relative 2^-8) plus bf16 probabilities in the value product.
    assert (out.float() - reference).abs().max() < 0.02 * max(1.0, float(reference.abs().max()))


def test_out_of_range_inputs_raise_instead_of_reading_stray_memory(ops: object) -> None:
    out_of_range_inputs_raise(ops, BF16)


def out_of_range_inputs_raise(ops: Any, dtype: torch.dtype) -> None:
    """Bad block ids, a short block table, positions past the rotary table, slots past the
    cache: each an error before any memory is read."""
    cache = torch.zeros(2, 3, 4, 16, 64, dtype=dtype)
    qkv = torch.zeros(2, 15 * 64, dtype=dtype)
    out = torch.empty(2, 9 * 64, dtype=dtype)
    with pytest.raises(RuntimeError, match="block id"):
        ops.paged_attention(qkv, cache, torch.tensor([[0, 2, 0]]), torch.tensor([[7]]), 9, 3, out)
    with pytest.raises(RuntimeError, match="block table"):
        ops.paged_attention(qkv, cache, torch.tensor([[0, 2, 30]]), torch.tensor([[0]]), 9, 3, out)
    cos = torch.zeros(8, 64)
    with pytest.raises(RuntimeError, match="position"):
        ops.rope_write_kv(
            qkv, torch.tensor([0, 8]), cos, cos, cache.view(2, 3, 64, 64), torch.tensor([0, 1]), 9, 3
        )
    with pytest.raises(RuntimeError, match="slot"):
        ops.rope_write_kv(
            qkv, torch.tensor([0, 1]), cos, cos, cache.view(2, 3, 64, 64), torch.tensor([0, 64]), 9, 3
        )


@pytest.fixture(scope="module")
def models(ops: object) -> tuple[LlamaModel, LlamaModel]:
    folder = resolve_model("smollm2", progress=False)
    fused = LlamaModel.load(folder, BF16, torch.device("cpu"), 512)
    plain = LlamaModel.load(folder, BF16, torch.device("cpu"), 512, fused=False)
    assert fused.ops is not None and plain.ops is None
    return fused, plain


def _logits(model: LlamaModel, steps: list[list[SequenceChunk]], block_size: int = 16) -> list[torch.Tensor]:
    cache = PagedKVCache(model.config, 512 // block_size, block_size, BF16, torch.device("cpu"))
    out = []
    for chunks in steps:
        inputs = build_input(chunks, block_size, torch.device("cpu"), fused=model.fused_attention(block_size))
        rows = torch.tensor(inputs.last_rows)
        out.append(model.forward(inputs.input_ids, inputs.positions, inputs.meta, cache, rows))
    return out


@pytest.mark.parametrize("block_size", [16, 8])
def test_fused_path_computes_what_the_plain_path_computes(
    models: tuple[LlamaModel, LlamaModel], block_size: int
) -> None:
    """A prompt in two chunks beside a short one, then decode steps of both together. Block
    size 8 is one the attention kernel does not take: plain attention, fused linear layers."""
    gen = torch.Generator().manual_seed(3)
    a = torch.randint(0, 49152, (70,), generator=gen).tolist()
    b = torch.randint(0, 49152, (21,), generator=gen).tolist()
    ta, tb = list(range(0, 80 // block_size)), list(range(80 // block_size, 112 // block_size))
    steps = [
        [SequenceChunk(a[:40], 0, ta), SequenceChunk(b[:20], 0, tb)],
        [SequenceChunk(b[20:], 20, tb), SequenceChunk(a[40:], 40, ta)],
        *[[SequenceChunk([a[i % 70]], 70 + i, ta), SequenceChunk([b[i % 21]], 21 + i, tb)] for i in range(5)],
    ]
    fused, plain = models
    for got, expected in zip(
        _logits(fused, steps, block_size), _logits(plain, steps, block_size), strict=True
    ):
        scale = float(expected.abs().max())
        assert (got - expected).abs().max() < 0.05 * scale  # seen: ~0.02 (bf16 rounding drift)
        # Greedy picks agree up to near-ties: our pick scores within 2% of the plain best (two
        # bf16 steps at the top logit, 0.25 at ~20, is ~1% of the scale: a near-tie was seen there).
        picked = expected.gather(1, got.argmax(-1, keepdim=True)).squeeze(1)
        assert (expected.max(-1).values - picked).max() <= 0.02 * scale


def _agrees_with_plain(model: LlamaModel, plain: LlamaModel, steps: list[list[SequenceChunk]]) -> None:
    for got, expected in zip(_logits(model, steps), _logits(plain, steps), strict=True):
        scale = float(expected.abs().max())
        assert (got - expected).abs().max() < 0.05 * scale
        picked = expected.gather(1, got.argmax(-1, keepdim=True)).squeeze(1)
        assert (expected.max(-1).values - picked).max() <= 0.02 * scale  # as above


@pytest.mark.parametrize(
    ("family", "kernel"),
    [
        ("linear", "small"),
        ("linear", "onednn"),
        ("linear", "torch"),
        ("attention", "torch"),
        ("elementwise", "torch"),
    ],
)
def test_every_kernel_forced_through_the_whole_model(
    models: tuple[LlamaModel, LlamaModel], family: str, kernel: str
) -> None:
    """What the measured choice may pick for any size, forced everywhere (the default, fused,
    is the ``models`` fixture): the same logits as the plain path within bf16 drift, the same
    greedy picks up to near-ties. Prefill in two chunks (one after a prefix), then decode."""
    folder = resolve_model("smollm2", progress=False)
    forced = LlamaModel.load(folder, BF16, torch.device("cpu"), 512, kernels={family: kernel})
    if family == "linear":
        assert {forced.weights.layers[0].qkv.kernel_for(r) for r in (1, 64)} == {kernel}
    else:
        assert forced.table is not None
        families = {
            k: k.split()[0] if k.split()[0] in ("linear", "attention") else "elementwise"
            for k in forced.table.plans
        }
        assert {forced.table.plans[k].impls for k, f in families.items() if f == family} == {(kernel,)}
    gen = torch.Generator().manual_seed(5)
    a = torch.randint(0, 49152, (40,), generator=gen).tolist()
    table = [0, 1, 2]
    steps = [
        [SequenceChunk(a[:24], 0, table)],
        [SequenceChunk(a[24:], 24, table)],
        *[[SequenceChunk([a[i]], 40 + i, table)] for i in range(3)],
    ]
    _fused, plain = models
    _agrees_with_plain(forced, plain, steps)


def test_a_mixed_route_through_the_whole_model(models: tuple[LlamaModel, LlamaModel]) -> None:
    """Decode rows on one attention, prefill chunks split between both by length, element-wise
    kernels switching by rows: what a measured table may say on a machine with AMX."""
    fused, plain = models
    keys = list(fused.table.plans) if fused.table is not None else []
    assert keys, "the default model has a measured table here"
    plans = dict(fused.table.plans)  # type: ignore[union-attr]
    for key in keys:
        if key.startswith("attention decode"):
            plans[key] = Plan((1, 4096), ("fused", "torch"))
        elif key.startswith("attention prefill"):
            plans[key] = Plan((16, 4096), ("torch", "fused"))
        elif not key.startswith("linear"):
            plans[key] = Plan((3, 4096), ("torch", "fused"))  # the 3-row decode step: torch
    mixed = LlamaModel(
        fused.config, fused.weights, 512, torch.device("cpu"), table=KernelTable("test", plans, {})
    )
    assert mixed.route is not None
    gen = torch.Generator().manual_seed(7)
    a, b, d = (torch.randint(0, 49152, (n,), generator=gen).tolist() for n in (40, 12, 30))
    ta, tb, td = [0, 1, 2], [3], [4, 5]
    steps = [
        [SequenceChunk(a[:20], 0, ta), SequenceChunk(b, 0, tb)],  # a: fused (20 > 16), b: torch
        [SequenceChunk([b[0]], 12, tb), SequenceChunk(a[20:], 20, ta), SequenceChunk(d[:10], 0, td)],
        [SequenceChunk([b[1]], 13, tb), SequenceChunk([a[0]], 40, ta), SequenceChunk(d[10:], 10, td)],
        [SequenceChunk([b[2]], 14, tb), SequenceChunk([a[1]], 41, ta), SequenceChunk([d[0]], 30, td)],
    ]
    _agrees_with_plain(mixed, plain, steps)


def test_an_unknown_kernel_is_refused_by_name() -> None:
    from interlock.errors import ConfigError

    folder = resolve_model("smollm2", progress=False)
    with pytest.raises(ConfigError, match="linear kernel 'amx'"):
        LlamaModel.load(folder, BF16, torch.device("cpu"), 512, kernels={"linear": "amx"})
    with pytest.raises(ConfigError, match="attention kernel 'sdpa'"):
        LlamaModel.load(folder, BF16, torch.device("cpu"), 512, kernels={"attention": "sdpa"})
    with pytest.raises(ConfigError, match="kernel family 'norm'"):
        LlamaModel.load(folder, BF16, torch.device("cpu"), 512, kernels={"norm": "fused"})
