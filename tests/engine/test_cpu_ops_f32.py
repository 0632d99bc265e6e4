"""The fused fp32 CPU kernels (AVX2 + FMA) against the plain PyTorch functions they replace.

Element-wise kernels and rotary embedding agree with PyTorch's fp32 to rounding (another
summation order); paged attention is compared with an fp32 softmax(QK^T)V over the gathered
blocks; the model-level tests run the same steps through the fused and the plain fp32 path.
Skipped, with the reason, on a CPU without AVX2 and FMA.
"""

from __future__ import annotations

import pytest
import torch

from interlock.engine.model import LlamaModel, PagedKVCache, SequenceChunk, build_input, cpu_ops
from interlock.engine.model.config import ModelArchConfig
from interlock.engine.model.dispatch import TorchKernels, model_ops
from interlock.engine.model.linear import Linear
from interlock.engine.model.rope import apply_rotary
from interlock.model_store import resolve_model
from tests.engine.test_cpu_ops import PAGED_CHUNKS, PAGED_SHAPES, out_of_range_inputs_raise, paged_case

F32 = torch.float32
pytestmark = pytest.mark.skipif(
    not cpu_ops.cpu_supports(cpu_ops.F32), reason="this CPU has no AVX2 and FMA; the plain path is used"
)


@pytest.fixture(scope="module")
def ops() -> object:
    loaded = cpu_ops.load_f32()
    assert loaded is not None, "the CPU supports the kernels, so they must build and load"
    return loaded


def _close(got: torch.Tensor, want: torch.Tensor, rel: float = 1e-5) -> bool:
    return bool((got - want).abs().max() <= rel * max(1.0, float(want.abs().max())))


def test_norms_and_swiglu_equal_pytorch_to_rounding(ops: object) -> None:
    gen = torch.Generator().manual_seed(0)
    x, h, delta = (torch.randn(37, 576, generator=gen) for _ in range(3))
    w = torch.randn(576, generator=gen)
    assert _close(ops.rms_norm(x, w, 1e-5), TorchKernels.rms_norm(x, w, 1e-5))  # type: ignore[attr-defined]
    residual = h.clone()
    out = ops.add_rms_norm(residual, delta, w, 1e-5)  # type: ignore[attr-defined]
    assert torch.equal(residual, h + delta) and _close(out, TorchKernels.rms_norm(h + delta, w, 1e-5))
    # Large gates of both signs: exp's range is where a hand-written silu goes wrong.
    gate_up = torch.randn(9, 2 * 1536, generator=gen) * 30
    assert _close(ops.silu_mul(gate_up), TorchKernels.silu_mul(gate_up), rel=1e-6)  # type: ignore[attr-defined]


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 13, 40])
@pytest.mark.parametrize(("features", "inputs", "bias"), [(24, 64, False), (96, 576, True), (200, 33, True)])
def test_small_batch_linear_on_bf16_weights_equals_f_linear(
    ops: object, rows: int, features: int, inputs: int, bias: bool
) -> None:
    """Row tails past the tiles of 4, 2 and 1, block tails past the tiles of 8/4/2, odd inputs."""
    gen = torch.Generator().manual_seed(rows * features)
    w = torch.randn(features, inputs, generator=gen).to(torch.bfloat16).float()
    b = torch.randn(features, generator=gen) if bias else None
    x = torch.randn(rows, inputs, generator=gen)
    packed = ops.pack_linear_weight(w.to(torch.bfloat16))  # type: ignore[attr-defined]
    got = ops.linear_small(x, packed, b)  # type: ignore[attr-defined]
    assert _close(got, torch.nn.functional.linear(x, w, b))
    linear = Linear(w, b)
    assert linear.small is not None and linear.weight is None and torch.equal(linear.plain_weight(), w)
    assert torch.equal(linear(x), got)


def test_weights_that_are_not_bf16_values_keep_fp32_and_onednn() -> None:
    """An fp32 checkpoint's weights would lose bits as bf16: never the small kernel."""
    w = torch.randn(64, 32, generator=torch.Generator().manual_seed(7))
    linear = Linear(w)
    assert linear.small is None and linear.kernel_for(1) != "small"
    x = torch.randn(3, 32)
    assert _close(linear(x), torch.nn.functional.linear(x, w))


def test_rope_rotates_q_and_k_in_place_and_stores_k_and_v(ops: object) -> None:
    heads, kv_heads, dim, n = 9, 3, 64, 20
    gen = torch.Generator().manual_seed(1)
    cos, sin = torch.randn(2, 600, dim, generator=gen)
    qkv = torch.randn(n, (heads + 2 * kv_heads) * dim, generator=gen)
    positions = torch.randint(0, 600, (n,), generator=gen)
    slots = torch.randperm(256, generator=gen)[:n]
    cache = torch.zeros(2, kv_heads, 256, dim)
    expected = apply_rotary(
        qkv[:, : (heads + kv_heads) * dim].view(n, -1, dim),
        cos[positions].unsqueeze(1),
        sin[positions].unsqueeze(1),
    )
    values = qkv[:, (heads + kv_heads) * dim :].view(n, kv_heads, dim).clone()
    ops.rope_write_kv(qkv, positions, cos, sin, cache, slots, heads, kv_heads)  # type: ignore[attr-defined]
    assert _close(qkv[:, : (heads + kv_heads) * dim].view(n, -1, dim), expected)
    assert torch.equal(
        cache[0][:, slots].transpose(0, 1),
        qkv[:, heads * dim : (heads + kv_heads) * dim].view(n, kv_heads, dim),
    )
    assert torch.equal(cache[1][:, slots].transpose(0, 1), values)


@pytest.mark.parametrize(("heads", "kv_heads", "dim", "block_size"), PAGED_SHAPES)
@pytest.mark.parametrize(("lengths", "starts"), PAGED_CHUNKS)
def test_paged_attention_matches_softmax_attention_over_the_blocks(
    ops: object, heads: int, kv_heads: int, dim: int, block_size: int, lengths: list[int], starts: list[int]
) -> None:
    # Scores of a few units: the softmax is neither flat nor one-hot.
    qkv, cache, info, tables, reference = paged_case(
        heads, kv_heads, dim, block_size, lengths, starts, F32, 0.5
    )
    out = torch.full((qkv.shape[0], heads * dim), float("nan"))
    ops.paged_attention(qkv, cache, info, tables, heads, kv_heads, out)  # type: ignore[attr-defined]
    assert _close(out, reference, rel=1e-5)


def test_out_of_range_inputs_raise_instead_of_reading_stray_memory(ops: object) -> None:
    out_of_range_inputs_raise(ops, F32)


def test_fp32_measures_every_operation_of_the_model() -> None:
    config = ModelArchConfig.from_folder(resolve_model("smollm2", progress=False))
    keys = [op.key for op in model_ops(config, 64, F32)]
    for head in (
        "linear",
        "attention decode",
        "attention prefill",
        "add_rms_norm",
        "silu_mul",
        "rope_write_kv",
    ):
        assert any(k.startswith(head) for k in keys), head


def _logits(model: LlamaModel, steps: list[list[SequenceChunk]]) -> list[torch.Tensor]:
    cache = PagedKVCache(model.config, 32, 16, F32, torch.device("cpu"))
    out = []
    for chunks in steps:
        inputs = build_input(chunks, 16, torch.device("cpu"), fused=model.fused_attention(16))
        out.append(
            model.forward(
                inputs.input_ids, inputs.positions, inputs.meta, cache, torch.tensor(inputs.last_rows)
            )
        )
    return out


@pytest.mark.parametrize("kernels", [{}, {"attention": "torch"}, {"elementwise": "torch"}])
def test_the_fused_fp32_model_computes_what_the_plain_path_computes(kernels: dict[str, str]) -> None:
    """A prompt in two chunks beside a short one, then decode steps of both together: the same
    logits as the plain fp32 path to rounding, and the same greedy picks."""
    folder = resolve_model("smollm2", progress=False)
    fused = LlamaModel.load(folder, F32, torch.device("cpu"), 512, kernels=kernels)
    plain = LlamaModel.load(folder, F32, torch.device("cpu"), 512, fused=False)
    assert fused.ops is not None and fused.fused_attention(16) and plain.ops is None
    gen = torch.Generator().manual_seed(3)
    a = torch.randint(0, 49152, (70,), generator=gen).tolist()
    b = torch.randint(0, 49152, (21,), generator=gen).tolist()
    ta, tb = [0, 1, 2, 3, 4], [5, 6]
    steps = [
        [SequenceChunk(a[:40], 0, ta), SequenceChunk(b[:20], 0, tb)],
        [SequenceChunk(b[20:], 20, tb), SequenceChunk(a[40:], 40, ta)],
        *[[SequenceChunk([a[i % 70]], 70 + i, ta), SequenceChunk([b[i % 21]], 21 + i, tb)] for i in range(5)],
    ]
    for got, expected in zip(_logits(fused, steps), _logits(plain, steps), strict=True):
        assert _close(got, expected, rel=1e-3)
        assert torch.equal(got.argmax(-1), expected.argmax(-1))
