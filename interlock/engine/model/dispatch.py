"""What each operation of the model may run, measured as ``kernel_choice.Op``s, and the
per-step choice that follows the measured table.

Operations (table key) and candidates:

* linear layers (``linear <out>x<in>``, by rows): ``linear.LINEAR_IMPLS`` (small / onednn / torch),
  the output head too (by sampled rows, up to the default ``max_num_seqs``, ``deploy.DEFAULT_MAX_NUM_SEQS``);
* attention over decode rows (``attention decode <heads>/<kv heads>x<dim> ctx <C>``, by decode
  batch, measured at ``DECODE_CONTEXTS`` tokens): ``fused`` (``cpu_ops``' paged flash attention,
  AVX-512 BF16 or AVX2 fp32) or ``torch`` (gather + two batched matmuls, ``attention.decode_attention``);
* attention over a prefill chunk (``attention prefill ...``, by chunk length, measured on fresh
  prompts): ``fused`` or ``torch`` (``causal_matmul_attention``: oneDNN bf16 matmuls, which use
  AMX tiles where the CPU has them);
* element-wise, by rows of the step: ``add_rms_norm <hidden>`` (also the first layer's plain
  RMSNorm), ``silu_mul <intermediate>``, ``rope_write_kv <heads>/<kv heads>x<dim>``: ``fused``
  or ``torch`` (``TorchKernels``: the same function in PyTorch ops).

A step's decode rows go to one attention (by their number and the context class nearest their
longest context); each prefill chunk to its own (by its length). In fp32 (``cpu_ops.F32``, AVX2 +
FMA) the same operations are measured; ``small`` there keeps bf16-valued weights as bf16. A model
with no fused library for its dtype (fp16, CUDA, a CPU without AVX2) runs the plain PyTorch path,
which has no choice to make and measures nothing.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from interlock.deploy import DEFAULT_MAX_NUM_SEQS
from interlock.engine.model import cpu_ops
from interlock.engine.model.attention import AttentionMetadata, decode_attention, prefill_attention, write_kv
from interlock.engine.model.batch import SequenceChunk, build_input, split_attention
from interlock.engine.model.config import ModelArchConfig
from interlock.engine.model.kernel_choice import (
    KernelTable,
    Op,
    Plan,
    buckets,
    load_or_measure,
    machine_key,
    random,
)
from interlock.engine.model.linear import LINEAR_IMPLS, linear_calls
from interlock.engine.model.rope import apply_rotary
from interlock.env import get_env
from interlock.errors import ConfigError

FUSED_IMPLS = ("fused", "torch")
FAMILIES = {"linear": LINEAR_IMPLS, "attention": FUSED_IMPLS, "elementwise": FUSED_IMPLS}
"""What can be forced (``INTERLOCK_<FAMILY>_KERNEL``), and to which implementations."""
DECODE_CONTEXTS = (256, 2048)
BLOCK_SIZE = 16


# ---- table keys ----
def linear_key(shape: tuple[int, int]) -> str:
    return f"linear {shape[0]}x{shape[1]}"


def _heads(c: ModelArchConfig) -> str:
    return f"{c.num_heads}/{c.num_kv_heads}x{c.head_dim}"


def decode_key(c: ModelArchConfig, context: int) -> str:
    return f"attention decode {_heads(c)} ctx {context}"


def prefill_key(c: ModelArchConfig) -> str:
    return f"attention prefill {_heads(c)}"


def elementwise_keys(c: ModelArchConfig) -> tuple[str, str, str]:
    """(norm, swiglu, rope) keys."""
    return f"add_rms_norm {c.hidden_size}", f"silu_mul {c.intermediate_size}", f"rope_write_kv {_heads(c)}"


def layer_shapes(config: ModelArchConfig) -> list[tuple[int, int]]:
    """(out, in) of each linear weight of a layer: qkv, o, gate_up, down."""
    c = config
    return [
        (c.q_size + 2 * c.kv_size, c.hidden_size),
        (c.hidden_size, c.q_size),
        (2 * c.intermediate_size, c.hidden_size),
        (c.hidden_size, c.intermediate_size),
    ]


# ---- the table for a model ----
def kernel_table(
    config: ModelArchConfig,
    dtype: torch.dtype,
    device: torch.device,
    *,
    fused: bool,
    kernels: Mapping[str, str],
    max_rows: int,
    progress: Callable[[str], None] | None = None,
) -> KernelTable | None:
    """The model's kernel table: measured (or read from the cache) for the families left on
    "auto" where there is a choice, with the forced ones (``kernels[family]``) set everywhere.
    None: no choice (the plain path, or no fused kernels: each linear layer's default)."""
    for family, impl in kernels.items():
        allowed = FAMILIES.get(family)
        if allowed is None:
            raise ConfigError(f"kernel family {family!r} is not one of {', '.join(FAMILIES)}")
        if impl not in ("auto", *allowed):
            raise ConfigError(f"{family} kernel {impl!r} is not one of auto, {', '.join(allowed)}")
    forced = {f: kernels.get(f, "auto") for f in FAMILIES}
    ops = model_ops(config, max_rows, dtype)
    choosing = fused and device.type == "cpu" and cpu_ops.ops_for(dtype) is not None
    auto = [op for op in ops if forced[_family(op.key)] == "auto"] if choosing else []
    if not auto and all(impl == "auto" for impl in forced.values()):
        return None
    table = KernelTable("forced", {}, {})
    if auto:
        lib = cpu_ops.library_for(dtype)
        assert lib is not None
        machine = machine_key([f"{lib.folder}={cpu_ops.build_dir(lib).name}"])
        table = load_or_measure(auto, cache_dir=get_env().cache_dir, machine=machine, progress=progress)
    # This model's operations only: the cache also holds other shapes measured on this machine
    # (another model, a tensor-parallel rank's share of this one).
    plans = {op.key: table.plans[op.key] for op in ops if op.key in table.plans}
    for op in ops:
        impl = forced[_family(op.key)]
        if impl != "auto":
            plans[op.key] = Plan.only(impl)
    return KernelTable(table.machine, plans, table.timings, table.provisional, table.measured_at)


def _family(key: str) -> str:
    head = key.split(" ", 1)[0]
    return head if head in ("linear", "attention") else "elementwise"


def fused_layers_usable(c: ModelArchConfig) -> bool:
    """Whether the fused kernels take this model's shapes (else its layers run the plain path,
    linear layers aside)."""
    return (
        c.head_dim in (64, 128)
        and c.num_heads % c.num_kv_heads == 0
        and c.num_heads // c.num_kv_heads <= 8
        and c.hidden_size % 16 == 0
        and c.intermediate_size % 16 == 0
    )


def model_ops(config: ModelArchConfig, max_rows: int, dtype: torch.dtype = torch.bfloat16) -> list[Op]:
    """Every operation the fused model path runs in ``dtype``, with its candidates (what is
    measured)."""
    c = config
    ops = [Op(linear_key(s), buckets(max_rows), linear_calls(s, dtype)) for s in layer_shapes(c)]
    # Decode batches are measured up to the engine's default max_num_seqs; larger ones use the
    # last range's choice.
    batch = min(DEFAULT_MAX_NUM_SEQS, max_rows)
    head = (c.vocab_size, c.hidden_size)  # sees only the rows that sample: one per sequence
    ops.append(Op(linear_key(head), buckets(batch), linear_calls(head, dtype)))
    if not fused_layers_usable(c):
        return ops
    ops += [Op(decode_key(c, ctx), buckets(batch), _decode_calls(c, ctx, dtype)) for ctx in DECODE_CONTEXTS]
    ops.append(
        Op(
            prefill_key(c),
            buckets(max_rows, low=16) if max_rows > 16 else (max_rows,),
            _prefill_calls(c, dtype),
        )
    )
    norm, swiglu, rope = elementwise_keys(c)
    ops += [
        Op(norm, buckets(max_rows), _norm_calls(c, dtype)),
        Op(swiglu, buckets(max_rows), _swiglu_calls(c, dtype)),
        Op(rope, buckets(max_rows), _rope_calls(c, dtype)),
    ]
    return ops


# ---- the choice at run time ----
@dataclass(frozen=True)
class AttentionRoute:
    """Which attention each part of a step runs."""

    decode: tuple[tuple[int, Plan], ...]
    """(context class, plan by decode batch)."""
    prefill: Plan
    """By chunk length."""

    @staticmethod
    def from_table(table: KernelTable | None, config: ModelArchConfig) -> AttentionRoute | None:
        """None where the table chose the fused kernel everywhere (or there is no table)."""
        if table is None:
            return None
        decode = tuple(
            (ctx, table.plans.get(decode_key(config, ctx), Plan.only("fused"))) for ctx in DECODE_CONTEXTS
        )
        route = AttentionRoute(decode, table.plans.get(prefill_key(config), Plan.only("fused")))
        plans = [plan for _ctx, plan in decode] + [route.prefill]
        return None if all(plan.used == {"fused"} for plan in plans) else route

    def decode_impl(self, batch: int, context: int) -> str:
        _ctx, plan = min(self.decode, key=lambda cp: abs(math.log(max(context, 1) / cp[0])))
        return plan.impl_for(batch)

    def prefill_impl(self, length: int) -> str:
        return self.prefill.impl_for(length)

    def split(self, meta: AttentionMetadata, block_size: int) -> AttentionMetadata:
        """The step's fused metadata with the parts this route sends to PyTorch made plain."""
        assert meta.seq_info is not None
        info = meta.seq_info.tolist()
        nd = meta.num_decode
        longest = max((start + 1 for _first, _n, start in info[:nd]), default=0)
        plain_decode = nd > 0 and self.decode_impl(nd, longest) == "torch"
        plain_prefill = [self.prefill_impl(n) == "torch" for _first, n, _start in info[nd:]]
        return split_attention(meta, block_size, plain_decode=plain_decode, plain_prefill=plain_prefill)


def attend(
    ops: Any, qkv: torch.Tensor, meta: AttentionMetadata, blocks: torch.Tensor, c: ModelArchConfig
) -> torch.Tensor:
    """Attention of a fused-path step: the fused kernel over ``seq_info``'s sequences, PyTorch's
    over the parts the route moved to the plain fields. ``qkv``'s q and k are already rotated
    and its k and v stored in ``blocks`` (``rope_write_kv``)."""
    n = qkv.shape[0]
    attn = torch.empty(n, c.q_size, dtype=qkv.dtype)
    assert meta.seq_info is not None
    if meta.seq_info.shape[0]:
        ops.paged_attention(qkv, blocks, meta.seq_info, meta.block_tables, c.num_heads, c.num_kv_heads, attn)
    if meta.decode_block_table is None and not meta.prefills:
        return attn
    q = qkv[:, : c.q_size].view(n, c.num_heads, c.head_dim)
    if meta.decode_block_table is not None:
        attn[: meta.num_decode] = decode_attention(q[: meta.num_decode], blocks, meta)
    for span in meta.prefills:
        rows = slice(span.start, span.end)
        k = qkv[rows, c.q_size : c.q_size + c.kv_size].view(-1, c.num_kv_heads, c.head_dim)
        v = qkv[rows, c.q_size + c.kv_size :].view(-1, c.num_kv_heads, c.head_dim)
        attn[rows] = prefill_attention(q[rows], k, v, blocks, span)
    return attn


class StepKernels(NamedTuple):
    """The element-wise kernels of one step, with the fused kernels' signatures."""

    rms_norm: Callable[..., torch.Tensor]
    add_rms_norm: Callable[..., torch.Tensor]
    silu_mul: Callable[..., torch.Tensor]
    rope_write_kv: Callable[..., None]


@dataclass(frozen=True)
class ElementwisePlans:
    norm: Plan
    swiglu: Plan
    rope: Plan

    @staticmethod
    def from_table(table: KernelTable | None, config: ModelArchConfig) -> ElementwisePlans:
        fused = Plan.only("fused")
        plans = table.plans if table is not None else {}
        norm, swiglu, rope = (plans.get(key, fused) for key in elementwise_keys(config))
        return ElementwisePlans(norm, swiglu, rope)

    def kernels(self, ops: Any, rows: int) -> StepKernels:
        def pick(plan: Plan, name: str) -> Callable[..., Any]:
            return getattr(ops if plan.impl_for(rows) == "fused" else TorchKernels, name)  # type: ignore[no-any-return]

        return StepKernels(
            pick(self.norm, "rms_norm"),
            pick(self.norm, "add_rms_norm"),
            pick(self.swiglu, "silu_mul"),
            pick(self.rope, "rope_write_kv"),
        )


class TorchKernels:
    """The fused element-wise kernels' functions in PyTorch ops (the ``torch`` candidates):
    norms and SwiGLU with the same bf16 recipe (bit-identical), rotary in fp32 rounded once."""

    @staticmethod
    def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        xf = x.float()
        inv = torch.rsqrt(xf.square().mean(-1, keepdim=True).add_(eps))
        return w * (xf * inv).to(x.dtype)

    @staticmethod
    def add_rms_norm(h: torch.Tensor, delta: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        h.add_(delta)
        return TorchKernels.rms_norm(h, w, eps)

    @staticmethod
    def silu_mul(x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate).mul_(up)

    @staticmethod
    def rope_write_kv(
        qkv: torch.Tensor,
        positions: torch.Tensor,
        cos: torch.Tensor,
        sin_signed: torch.Tensor,
        kv: torch.Tensor,
        slots: torch.Tensor,
        num_heads: int,
        num_kv_heads: int,
    ) -> None:
        n, dim = qkv.shape[0], cos.shape[1]
        width = (num_heads + num_kv_heads) * dim
        qk = qkv[:, :width].view(n, -1, dim)
        c, s = cos.index_select(0, positions).unsqueeze(1), sin_signed.index_select(0, positions).unsqueeze(1)
        qk.copy_(apply_rotary(qk.float(), c, s))
        write_kv(kv, qk[:, num_heads:], qkv[:, width:].view(n, num_kv_heads, dim), slots)


# ---- candidates, for measuring ----
Calls = Callable[[int], Mapping[str, Callable[[], object]]]


def _attention_calls(
    c: ModelArchConfig, chunks_for: Callable[[int], Sequence[SequenceChunk]], dtype: torch.dtype
) -> Calls:
    def calls(size: int) -> Mapping[str, Callable[[], object]]:
        ops: Any = cpu_ops.ops_for(dtype)
        chunks = chunks_for(size)
        rows = sum(len(ch.token_ids) for ch in chunks)
        num_blocks = 1 + max(b for ch in chunks for b in ch.block_table)
        blocks = random(2, c.num_kv_heads, num_blocks, BLOCK_SIZE, c.head_dim, dtype=dtype)
        qkv = random(rows, c.q_size + 2 * c.kv_size, dtype=dtype)
        fused = build_input(chunks, BLOCK_SIZE, torch.device("cpu"), fused=True).meta
        plain = split_attention(
            fused, BLOCK_SIZE, plain_decode=True, plain_prefill=[True] * (len(chunks) - fused.num_decode)
        )
        return {
            "fused": functools.partial(attend, ops, qkv, fused, blocks, c),
            "torch": functools.partial(attend, ops, qkv, plain, blocks, c),
        }

    return calls


def _decode_calls(c: ModelArchConfig, context: int, dtype: torch.dtype) -> Calls:
    per = -(-context // BLOCK_SIZE)

    def chunks(batch: int) -> list[SequenceChunk]:
        return [SequenceChunk([0], context - 1, range(b * per, (b + 1) * per)) for b in range(batch)]

    return _attention_calls(c, chunks, dtype)


def _prefill_calls(c: ModelArchConfig, dtype: torch.dtype) -> Calls:
    def chunks(length: int) -> list[SequenceChunk]:
        return [SequenceChunk(range(length), 0, range(-(-length // BLOCK_SIZE)))]

    return _attention_calls(c, chunks, dtype)


def _norm_calls(c: ModelArchConfig, dtype: torch.dtype) -> Calls:
    def calls(rows: int) -> Mapping[str, Callable[[], object]]:
        ops: Any = cpu_ops.ops_for(dtype)
        h, delta = (
            random(rows, c.hidden_size, dtype=dtype),
            random(rows, c.hidden_size, dtype=dtype, scale=1e-3),
        )
        w = random(c.hidden_size, dtype=dtype)
        return {
            "fused": lambda: ops.add_rms_norm(h, delta, w, 1e-5),
            "torch": lambda: TorchKernels.add_rms_norm(h, delta, w, 1e-5),
        }

    return calls


def _swiglu_calls(c: ModelArchConfig, dtype: torch.dtype) -> Calls:
    def calls(rows: int) -> Mapping[str, Callable[[], object]]:
        ops: Any = cpu_ops.ops_for(dtype)
        x = random(rows, 2 * c.intermediate_size, dtype=dtype)
        return {"fused": lambda: ops.silu_mul(x), "torch": lambda: TorchKernels.silu_mul(x)}

    return calls


def _rope_calls(c: ModelArchConfig, dtype: torch.dtype) -> Calls:
    def calls(rows: int) -> Mapping[str, Callable[[], object]]:
        ops: Any = cpu_ops.ops_for(dtype)
        qkv = random(rows, c.q_size + 2 * c.kv_size, dtype=dtype)
        angles = random(rows, c.head_dim // 2, dtype=torch.float32)
        cos = torch.cat([angles.cos(), angles.cos()], -1)
        sin = torch.cat([-angles.sin(), angles.sin()], -1)
        positions = torch.arange(rows)
        kv = torch.empty(2, c.num_kv_heads, rows, c.head_dim, dtype=dtype)
        args = (qkv, positions, cos, sin, kv, positions, c.num_heads, c.num_kv_heads)
        return {"fused": lambda: ops.rope_write_kv(*args), "torch": lambda: TorchKernels.rope_write_kv(*args)}

    return calls
