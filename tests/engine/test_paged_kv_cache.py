"""PagedKVCache export/import: the block-after-block format, any block order, one pass."""

from __future__ import annotations

import pytest
import torch

from interlock.engine.model.config import ModelArchConfig, RopeScaling
from interlock.engine.model.kv_cache import PagedKVCache

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
