"""The decode side of a streamed KV transfer: blocks imported as they arrive, the rest on DONE,
and a pull that fails after a partial import recomputes the prompt (nothing half-imported is
ever taken for computed, no block leaks). The one copy: blocks copied from the prefill's shared
cache count only if the source held them through the copy."""

from __future__ import annotations

import pytest

from interlock.engine.clock import VirtualClock
from interlock.engine.core import EngineCore
from interlock.engine.runners.mock import MockRunner, reference_output
from interlock.engine.shared_cache import SharedCacheView
from interlock.protocol import GenerateRequest, KVTransferParams, SamplingParams
from tests.engine.conftest import VOCAB, make_config, make_engine, run_to_end, tokens

PROMPT = list(range(300, 310))
REF = reference_output(PROMPT, 12, vocab_size=VOCAB)


def _prefilled() -> tuple[KVTransferParams, bytes]:
    prefill = make_engine()
    kt = KVTransferParams(do_remote_decode=True)
    sp = SamplingParams(max_tokens=12, ignore_eos=True)
    prefill.add_request(GenerateRequest(request_id="p", token_ids=tuple(PROMPT), sampling=sp, kv_transfer=kt))
    out = run_to_end(prefill)["p"][-1].kv_transfer
    assert out is not None
    _, data = prefill.export_request_kv("p")
    prefill.release_request_kv("p")
    return out, data


def _parked(kt: KVTransferParams) -> EngineCore:
    decode = make_engine()
    sp = SamplingParams(max_tokens=12, ignore_eos=True)
    decode.add_remote_request(
        GenerateRequest(request_id="d", token_ids=tuple(PROMPT), sampling=sp, kv_transfer=kt)
    )
    decode.step()
    assert "d" in decode.scheduler.remote_parked
    return decode


def test_blocks_imported_as_they_arrive_then_the_rest_on_done() -> None:
    kt, data = _prefilled()
    decode = _parked(kt)
    runner = decode.runner
    assert isinstance(runner, MockRunner)
    size = runner.kv_block_nbytes
    blocks = list(decode.kv.block_table("d")[:3])
    assert decode.import_remote_kv("d", memoryview(data), 1) == 1
    assert runner.kv[blocks[0]].tobytes() == data[:size] and (runner.kv[blocks[1:]] == -1).all()
    assert decode.import_remote_kv("d", memoryview(data), 1) == 1  # nothing new: nothing done
    assert decode.import_remote_kv("d", memoryview(data), 2) == 2
    # On DONE only the third block is imported: a payload whose first blocks were overwritten
    # since (a recycled receive buffer would be) leaves the imported ones alone.
    tail = bytearray(data)
    tail[: 2 * size] = bytes(2 * size)
    assert decode.finish_remote_kv("d", memoryview(tail))
    assert runner.kv[blocks].tobytes() == data
    outs = run_to_end(decode)["d"]
    assert tokens(outs) == REF and outs[0].num_cached_tokens == 10
    decode.check_integrity()
    assert decode.pool.num_used_blocks == 0


def test_nothing_is_imported_before_the_request_is_parked_or_with_a_foreign_payload() -> None:
    kt, data = _prefilled()
    decode = make_engine()
    assert decode.import_remote_kv("d", memoryview(data), 3) == 0  # unknown
    decode = _parked(kt)
    assert decode.import_remote_kv("d", memoryview(data[:-1]), 3) == 0  # not its payload's size
    assert decode.finish_remote_kv("d", memoryview(data))
    assert tokens(run_to_end(decode)["d"]) == REF


def test_a_pull_failing_after_a_partial_import_recomputes_the_prompt() -> None:
    kt, data = _prefilled()
    decode = _parked(kt)
    garbage = memoryview(bytes(len(data)))  # imported, then the source died: never used
    assert decode.import_remote_kv("d", garbage, 2) == 2
    assert decode.finish_remote_kv("d", None)
    outs = run_to_end(decode)["d"]
    assert tokens(outs) == REF and outs[0].num_cached_tokens == 0
    decode.check_integrity()
    assert decode.pool.num_used_blocks == 0


def _shared_prefill() -> tuple[KVTransferParams, EngineCore]:
    """A prefill engine whose cache is shared, holding the prompt's blocks (the one copy)."""
    config = make_config()
    runner = MockRunner(num_blocks=64, block_size=config.cache.block_size, vocab_size=VOCAB, shared=True)
    prefill = EngineCore(config, runner, clock=VirtualClock())
    kt = KVTransferParams(do_remote_decode=True)
    sp = SamplingParams(max_tokens=12, ignore_eos=True)
    prefill.add_request(GenerateRequest(request_id="p", token_ids=tuple(PROMPT), sampling=sp, kv_transfer=kt))
    out = run_to_end(prefill)["p"][-1].kv_transfer
    assert out is not None
    return out, prefill


@pytest.mark.parametrize("held", [True, False])
def test_the_one_copy_is_kept_only_if_the_source_held_its_blocks_through_it(held: bool) -> None:
    kt, prefill = _shared_prefill()
    assert prefill.keep_held("p") and not prefill.keep_held("nobody")
    region = prefill.runner.shared_region()
    assert region is not None
    view = SharedCacheView(region)
    decode = make_engine()
    assert decode.copy_remote_kv("d", view, kt.source_block_ids, lambda: True) is None  # unknown
    decode = _parked(kt)
    asked = []
    assert decode.copy_remote_kv("d", view, kt.source_block_ids, lambda: asked.append(1) or held) is held
    assert asked == [1]  # asked after the copy
    outs = run_to_end(decode)["d"]
    assert tokens(outs) == REF and outs[0].num_cached_tokens == (10 if held else 0)
    assert decode.pool.num_used_blocks == 0
    assert prefill.release_request_kv("p") and prefill.pool.num_used_blocks == 0
    view.close()


def test_source_block_ids_that_do_not_fit_recompute_the_prompt() -> None:
    kt, prefill = _shared_prefill()
    region = prefill.runner.shared_region()
    assert region is not None
    view = SharedCacheView(region)
    for bad in ((*kt.source_block_ids[:-1], region.num_blocks), kt.source_block_ids[:-1]):
        decode = _parked(kt)
        assert decode.copy_remote_kv("d", view, bad, lambda: True) is False
        outs = run_to_end(decode)["d"]
        assert tokens(outs) == REF and outs[0].num_cached_tokens == 0
    view.close()


def test_the_one_copy_in_parts_then_the_rest_with_the_hold_check() -> None:
    """Each part is a slice of every block (the mock: of its token slots), so the steps copy
    every block a little at a time; the last parts come with the hold check."""
    kt, prefill = _shared_prefill()
    region = prefill.runner.shared_region()
    assert region is not None
    view = SharedCacheView(region)
    decode = make_engine()
    assert decode.copy_remote_blocks("d", view, kt.source_block_ids, 1, 4) == 0  # not parked
    decode = _parked(kt)
    runner = decode.runner
    assert isinstance(runner, MockRunner)
    blocks = list(decode.kv.block_table("d")[:3])
    source = prefill.runner
    assert isinstance(source, MockRunner)
    src = source.kv[list(kt.source_block_ids)]
    assert decode.copy_remote_blocks("d", view, kt.source_block_ids, 1, 4) == 1
    assert (runner.kv[blocks, 1:] == -1).all() and (runner.kv[blocks, :1] == src[:, :1]).all()
    with pytest.raises(ValueError, match="2 source blocks for a prompt of 3"):
        decode.copy_remote_blocks("d", view, kt.source_block_ids[:2], 2, 4)
    with pytest.raises(ValueError, match="a copy in 2 parts, 1 of 4 copied already"):
        decode.copy_remote_blocks("d", view, kt.source_block_ids, 2, 2)
    assert decode.copy_remote_blocks("d", view, kt.source_block_ids, 3, 4) == 3
    assert (runner.kv[blocks, 3:] == -1).all() and (runner.kv[blocks, :3] == src[:, :3]).all()
    assert decode.copy_remote_blocks("d", view, kt.source_block_ids, 9, 4) == 4  # at most all
    assert decode.copy_remote_kv("d", view, kt.source_block_ids, lambda: True) is True
    outs = run_to_end(decode)["d"]
    assert tokens(outs) == REF and outs[0].num_cached_tokens == 10
    assert decode.pool.num_used_blocks == 0
    view.close()


def test_the_one_copy_leaves_the_last_parts_to_the_hold_check() -> None:
    kt, prefill = _shared_prefill()
    region = prefill.runner.shared_region()
    assert region is not None
    view = SharedCacheView(region)
    decode = _parked(kt)
    assert decode.copy_remote_blocks("d", view, kt.source_block_ids, 1, 3) == 1
    assert decode.copy_remote_kv("d", view, kt.source_block_ids, lambda: True) is True
    outs = run_to_end(decode)["d"]
    assert tokens(outs) == REF and outs[0].num_cached_tokens == 10
    assert decode.pool.num_used_blocks == 0
    view.close()
