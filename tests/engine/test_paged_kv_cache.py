"""PagedKVCache export/import: the block-after-block format, any block order, one pass."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from interlock.engine.model import cpu_ops
from interlock.engine.model.config import ModelArchConfig, RopeScaling
from interlock.engine.model.kv_cache import PagedKVCache
from interlock.env import get_env

ARCH = ModelArchConfig(
    architecture="llama",
    vocab_size=10,
    hidden_size=8,
    intermediate_size=8,
    num_layers=3,
    num_heads=2,
    num_kv_heads=2,
    head_dim=4,
    rms_norm_eps=1e-5,
    rope_theta=1e4,
    rope_scaling=RopeScaling(),
    max_position_embeddings=64,
    tie_word_embeddings=True,
    qkv_bias=False,
    eos_token_ids=(2,),
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("ids", [[3], [0, 1, 2, 3], [5, 2, 3, 4, 0], [7, 6, 1, 2, 9, 10, 11]])
def test_export_is_blocks_one_after_another_and_import_puts_them_back(
    dtype: torch.dtype, ids: list[int]
) -> None:
    src = PagedKVCache(ARCH, 12, 4, dtype, torch.device("cpu"))
    src.tensor.copy_(torch.randn(src.tensor.shape).to(dtype))
    out = bytearray(len(ids) * src.block_nbytes)
    src.export_blocks(ids, memoryview(out))
    want = src.tensor.index_select(3, torch.tensor(ids)).permute(3, 0, 1, 2, 4, 5).contiguous()
    got = torch.frombuffer(out, dtype=torch.uint8).view(dtype).view(want.shape)
    assert torch.equal(got, want)
    dst = PagedKVCache(ARCH, 12, 4, dtype, torch.device("cpu"))
    targets = [11 - i for i in range(len(ids))]
    dst.import_blocks(targets, memoryview(bytes(out)))  # read-only buffer
    for s, d in zip(ids, targets, strict=True):
        assert torch.equal(dst.tensor[:, :, :, d], src.tensor[:, :, :, s])
    untouched = [b for b in range(12) if b not in targets]
    assert not dst.tensor[:, :, :, untouched].any()


def test_out_of_range_ids_and_wrong_sizes_are_refused() -> None:
    kv = PagedKVCache(ARCH, 4, 4, torch.float32, torch.device("cpu"))
    with pytest.raises(IndexError):
        kv.export_blocks([4], memoryview(bytearray(kv.block_nbytes)))
    with pytest.raises(ValueError):
        kv.import_blocks([0], memoryview(bytearray(kv.block_nbytes + 1)))


# ---- the block-copy kernel (csrc/kv_copy.c) against a reference copy and the numpy fallback ----
ODD = dataclasses.replace(ARCH, num_layers=2, num_kv_heads=3, head_dim=3)
"""Pieces of 3 * block_size elements: not a multiple of the kernel's 16-byte stores."""


def _caches(arch: ModelArchConfig, blocks: int, bs: int, dtype: torch.dtype) -> list[PagedKVCache]:
    """The same cache twice: copying with the kernel, and through numpy (the fallback)."""
    kernel = PagedKVCache(arch, blocks, bs, dtype, torch.device("cpu"))
    assert kernel._kernel is not None, "the copy kernel did not build here"
    plain = PagedKVCache(arch, blocks, bs, dtype, torch.device("cpu"))
    plain._kernel = None
    return [kernel, plain]


def _reference_export(kv: PagedKVCache, ids: list[int]) -> bytes:
    gathered = kv.tensor.index_select(3, torch.tensor(ids, dtype=torch.long))
    return gathered.permute(3, 0, 1, 2, 4, 5).contiguous().view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("arch, bs", [(ARCH, 4), (ODD, 1), (ODD, 5)])
@pytest.mark.parametrize("seed", range(4))
def test_kernel_copies_random_blocks_as_the_reference_does(
    dtype: torch.dtype, arch: ModelArchConfig, bs: int, seed: int
) -> None:
    rng = random.Random(seed)
    blocks = 24
    caches = _caches(arch, blocks, bs, dtype)
    start = torch.randn(caches[0].tensor.shape).to(dtype)
    for kv in caches:
        kv.tensor.copy_(start)
    ids = rng.sample(range(blocks), rng.randint(1, blocks))
    want = _reference_export(caches[0], ids)
    # Unaligned buffers too: the kernel's streaming stores start at any byte.
    skew = rng.randint(0, 15)
    for kv in caches:
        out = bytearray(skew + len(ids) * kv.block_nbytes)
        kv.export_blocks(ids, memoryview(out)[skew:])
        assert bytes(out[skew:]) == want
    # Import with repeated targets: the later block wins, as in a sequential copy.
    targets = [rng.randrange(blocks) for _ in ids]
    payload = bytes(rng.getrandbits(8) for _ in range(len(ids) * caches[0].block_nbytes))
    expected = start.clone()
    for k, b in enumerate(targets):
        chunk = payload[k * caches[0].block_nbytes : (k + 1) * caches[0].block_nbytes]
        block = torch.frombuffer(bytearray(chunk), dtype=torch.uint8).view(dtype)
        expected[:, :, :, b] = block.view(expected[:, :, :, b].shape)
    for kv in caches:
        kv.import_blocks(targets, memoryview(b"?" * skew + payload)[skew:])
        assert torch.equal(kv.tensor.view(torch.uint8), expected.view(torch.uint8))


@pytest.mark.parametrize(
    "arch, bs", [(ARCH, 4), (ODD, 1), (dataclasses.replace(ODD, num_layers=1, num_kv_heads=1), 2)]
)
@pytest.mark.parametrize("seed", range(3))
def test_export_in_run_order_equals_the_reference_with_repeats_and_neighbours(
    arch: ModelArchConfig, bs: int, seed: int
) -> None:
    """Export reads a run at a time in source-address order (kv_copy.c, by_run): ids repeated,
    consecutive (merged pieces where the layout allows it) and shuffled come out in call order."""
    rng = random.Random(seed)
    blocks = 40
    caches = _caches(arch, blocks, bs, torch.bfloat16)
    start = torch.randn(caches[0].tensor.shape).to(torch.bfloat16)
    ids = [rng.randrange(blocks) for _ in range(30)] + list(range(7, 19)) + [3, 3, 39, 0]
    rng.shuffle(ids)
    for kv in caches:
        kv.tensor.copy_(start)
    want = _reference_export(caches[0], ids)
    for kv in caches:
        out = bytearray(1 + len(ids) * kv.block_nbytes)
        kv.export_blocks(ids, memoryview(out)[1:])
        assert bytes(out[1:]) == want


def test_kernel_refuses_what_the_fallback_refuses() -> None:
    for kv in _caches(ARCH, 4, 4, torch.bfloat16):
        with pytest.raises(IndexError):
            kv.import_blocks([0, -1], memoryview(bytes(2 * kv.block_nbytes)))
        with pytest.raises(IndexError):
            kv.export_blocks([4], memoryview(bytearray(kv.block_nbytes)))
        with pytest.raises(ValueError):
            kv.export_blocks([0, 1], memoryview(bytearray(kv.block_nbytes)))
        with pytest.raises(ValueError):
            kv.export_blocks([0], memoryview(bytes(kv.block_nbytes)))  # read-only
        kv.export_blocks([], memoryview(bytearray(0)))
        kv.import_blocks([], memoryview(b""))
        assert not kv.tensor.any()


@pytest.fixture
def fresh_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[pytest.MonkeyPatch]:
    """``get_env`` and ``load_copy`` read again, in an empty cache folder; restored after."""
    monkeypatch.setenv("INTERLOCK_CACHE_DIR", str(tmp_path))
    get_env.cache_clear()
    cpu_ops.load_copy.cache_clear()
    yield monkeypatch
    monkeypatch.undo()
    get_env.cache_clear()
    cpu_ops.load_copy.cache_clear()


def _round_trip(kv: PagedKVCache) -> None:
    kv.tensor.copy_(torch.randn(kv.tensor.shape).to(kv.dtype))
    out = bytearray(3 * kv.block_nbytes)
    kv.export_blocks([5, 1, 2], memoryview(out))
    assert bytes(out) == _reference_export(kv, [5, 1, 2])


def test_the_kernel_builds_in_an_empty_cache_folder(fresh_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert cpu_ops.load_copy() is not None
    assert (cpu_ops.copy_build_dir() / "libkv_copy.so").is_file()
    assert cpu_ops.copy_build_dir().is_relative_to(tmp_path)


def test_without_a_compiler_or_switched_off_copies_go_through_numpy(
    fresh_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fresh_env.setenv("PATH", "")  # no cc, and nothing built in the fresh cache folder
    assert cpu_ops.load_copy() is None
    assert "no C compiler" in caplog.text
    kv = PagedKVCache(ARCH, 8, 4, torch.bfloat16, torch.device("cpu"))
    assert kv._kernel is None
    _round_trip(kv)
    fresh_env.undo()
    fresh_env.setenv("INTERLOCK_CPU_KERNELS", "0")
    get_env.cache_clear()
    cpu_ops.load_copy.cache_clear()
    assert cpu_ops.load_copy() is None
    _round_trip(PagedKVCache(ARCH, 8, 4, torch.float32, torch.device("cpu")))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_import_each_takes_blocks_from_anywhere(dtype: torch.dtype) -> None:
    """Blocks in separate buffers (host-tier slots), some read-only, into scattered ids."""
    rng = random.Random(1)
    caches = _caches(ARCH, 12, 4, dtype)
    nbytes = caches[0].block_nbytes
    slots = [bytes(rng.getrandbits(8) for _ in range(nbytes)) for _ in range(5)]
    views = [memoryview(s) if k % 2 else memoryview(bytearray(s)) for k, s in enumerate(slots)]
    targets = [9, 0, 4, 9, 7]
    reference = PagedKVCache(ARCH, 12, 4, dtype, torch.device("cpu"))
    reference.import_blocks(targets, memoryview(b"".join(slots)))
    for kv in caches:
        kv.import_each(targets, views)
        assert torch.equal(kv.tensor.view(torch.uint8), reference.tensor.view(torch.uint8))
        with pytest.raises(IndexError):
            kv.import_each([0, 12], views[:2])
        with pytest.raises(ValueError):
            kv.import_each([0, 1], views[:1])
        with pytest.raises(ValueError):
            kv.import_each([0], [memoryview(bytes(nbytes - 1))])
        kv.import_each([], [])
