from __future__ import annotations

import numpy as np
import pytest

from interlock.engine.clock import VirtualClock
from interlock.engine.runner import ScheduledRequest, SchedulerOutput
from interlock.engine.runners.mock import MockRunner, reference_output
from interlock.engine.timing import TimingModel, decode_ms, prefill_ms
from interlock.protocol import SamplingParams

SP = SamplingParams()


def _prefill(runner: MockRunner, rid: str, prompt: list[int], table: list[int]) -> int:
    s = ScheduledRequest(rid, prompt, 0, table, SP, do_sample=True)
    return runner.execute(SchedulerOutput([s])).sampled[rid]


def test_next_token_depends_on_kv_content_not_batching() -> None:
    runner = MockRunner(num_blocks=8, block_size=4, vocab_size=100, timing=None)
    prompt = list(range(10))
    alone = _prefill(runner, "a", prompt, [0, 1, 2])
    batch = SchedulerOutput(
        [
            ScheduledRequest("x", [7, 7], 0, [5], SP, do_sample=True),
            ScheduledRequest("b", prompt, 0, [4, 3, 6], SP, do_sample=True),
        ]
    )
    assert runner.execute(batch).sampled["b"] == alone == reference_output(prompt, 1, vocab_size=100)[0]


def test_export_import_round_trip_copies_kv() -> None:
    src = MockRunner(num_blocks=8, block_size=4, timing=None)
    dst = MockRunner(num_blocks=8, block_size=4, timing=None)
    prompt = list(range(20, 31))
    tok = _prefill(src, "a", prompt, [1, 2, 3])
    buf = bytearray(3 * src.kv_block_nbytes)
    src.export_blocks([1, 2, 3], memoryview(buf))
    dst.import_blocks([7, 0, 5], memoryview(buf))
    assert np.array_equal(dst.kv[[7, 0, 5]], src.kv[[1, 2, 3]])
    # Decoding on the importer continues exactly as on the exporter.
    step = ScheduledRequest("a", [tok], 11, [7, 0, 5], SP, do_sample=True, num_output_tokens=1)
    out = dst.execute(SchedulerOutput([step])).sampled["a"]
    assert [tok, out] == reference_output(prompt, 2)
    # And a transfer that lost a block does not.
    dst.kv[0, 2] = 999  # position 6: not among the last tokens, still read
    assert dst.execute(SchedulerOutput([step])).sampled["a"] != out


def test_timing_model_matches_dynamo_fit() -> None:
    assert prefill_ms(0) == pytest.approx(16.50142)
    assert prefill_ms(1000) == pytest.approx(0.4209989 + 15.18344 + 16.50142)
    assert decode_ms(0.0) == pytest.approx(5.74)
    assert decode_ms(0.5) == pytest.approx(-25.74 / 4 + 27.005 + 5.74)
    assert decode_ms(5.0) == 1.0
    model = TimingModel(speedup=10)
    assert model.step_s(100, 0, 0.0) == pytest.approx(prefill_ms(100) / 10_000)
    assert model.step_s(100, 3, 0.5) == pytest.approx((prefill_ms(100) + decode_ms(0.5)) / 10_000)
    assert model.step_s(0, 0, 0.0) == 0.0


def test_step_time_recorded_and_virtual_clock_untouched() -> None:
    clock = VirtualClock()
    runner = MockRunner(num_blocks=8, block_size=4, clock=clock)
    _prefill(runner, "a", list(range(8)), [0, 1, 2])
    assert runner.last_step_time_s == pytest.approx(prefill_ms(8) / 1000)
    assert clock.now() == 0.0
    dec = ScheduledRequest("a", [5], 8, [0, 1, 2], SP, do_sample=True, num_output_tokens=1)
    runner.execute(SchedulerOutput([dec]))
    assert runner.last_step_time_s == pytest.approx(decode_ms(9 / 32) / 1000)
