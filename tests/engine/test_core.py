from __future__ import annotations

import pytest

from interlock import kvhash
from interlock.engine.clock import VirtualClock
from interlock.engine.core import EngineCore
from interlock.engine.runner import RunnerOutput, SchedulerOutput
from interlock.engine.runners.mock import MockRunner, reference_output
from interlock.protocol import (
    BlockRemoved,
    BlockStored,
    GenerateRequest,
    KVTransferParams,
    SamplingParams,
)
from tests.engine.conftest import VOCAB, make_config, make_engine, request, run_to_end, tokens

PROMPT = list(range(300, 310))
REF = reference_output(PROMPT, 12, vocab_size=VOCAB)


def _engine_with_eos(eos: int) -> EngineCore:
    runner = MockRunner(num_blocks=64, block_size=4, vocab_size=VOCAB, eos_token_ids=(eos,))
    return EngineCore(make_config(), runner, clock=VirtualClock())


def _final(engine: EngineCore, req: GenerateRequest) -> tuple[list[int], str | None]:
    engine.add_request(req)
    outs = run_to_end(engine)[req.request_id]
    assert all(o.finish_reason is None for o in outs[:-1])
    return tokens(outs), outs[-1].finish_reason


# ---- stop conditions ----
def test_max_tokens_finishes_with_length() -> None:
    assert _final(make_engine(), request("a", PROMPT, 12)) == (REF, "length")


def test_eos_stops_unless_ignored_or_before_min_tokens() -> None:
    eos = REF[3]
    assert REF.index(eos) == 3
    sp = SamplingParams(max_tokens=12, ignore_eos=False)
    r = GenerateRequest(request_id="a", token_ids=tuple(PROMPT), sampling=sp)
    assert _final(_engine_with_eos(eos), r) == (REF[:4], "stop")
    sp = SamplingParams(max_tokens=12, ignore_eos=False, min_tokens=5)
    r = GenerateRequest(request_id="b", token_ids=tuple(PROMPT), sampling=sp)
    assert _final(_engine_with_eos(eos), r) == (REF, "length")
    assert _final(_engine_with_eos(eos), request("c", PROMPT, 12)) == (REF, "length")  # ignore_eos


def test_stop_token_ids() -> None:
    assert _final(make_engine(), request("a", PROMPT, 12, stop_token_ids=(REF[5],))) == (REF[:6], "stop")


def test_outputs_stream_one_token_per_step_with_counters() -> None:
    engine = make_engine()
    engine.add_request(request("a", PROMPT, 3))
    outs = run_to_end(engine)["a"]
    assert [o.token_ids for o in outs] == [(t,) for t in REF[:3]]
    assert all(o.num_prompt_tokens == 10 for o in outs)


# ---- bad requests ----
def test_bad_requests_get_clear_errors_and_do_not_harm_others() -> None:
    engine = make_engine(max_model_len=64)
    engine.add_request(request("good", PROMPT, 12))
    engine.add_request(request("empty", []))
    engine.add_request(request("vocab", [VOCAB + 5]))
    engine.add_request(request("temp", PROMPT, temperature=-1.0))
    engine.add_request(request("long", [1] * 60, max_tokens=10))
    engine.add_request(request("good", PROMPT))  # duplicate id
    outs = run_to_end(engine)
    errors = {rid: o[-1].error for rid, o in outs.items() if rid != "good"}
    assert {rid: e.code for rid, e in errors.items() if e} == {
        "empty": "invalid_request",
        "vocab": "invalid_request",
        "temp": "invalid_request",
        "long": "prompt_too_long",
    }
    assert all(e is not None and e.status == 400 and e.message for e in errors.values())
    good = outs["good"]
    assert [o.error for o in good if o.error] and tokens([o for o in good if not o.error]) == REF
    assert engine.pool.num_used_blocks == 0


class FlakyRunner(MockRunner):
    """Fails any batch containing token 13."""

    def execute(self, batch: SchedulerOutput) -> RunnerOutput:
        if any(13 in s.token_ids for s in batch.scheduled):
            raise RuntimeError("kernel exploded")
        return super().execute(batch)


def test_runner_failure_fails_the_batch_and_the_engine_goes_on() -> None:
    runner = FlakyRunner(num_blocks=64, block_size=4, vocab_size=VOCAB)
    engine = EngineCore(make_config(), runner, clock=VirtualClock())
    engine.add_request(request("bad", [13, 14]))
    outs = run_to_end(engine)
    err = outs["bad"][-1].error
    assert outs["bad"][-1].finish_reason == "error" and err is not None and err.code == "engine_error"
    engine.add_request(request("good", PROMPT, 12))
    assert tokens(run_to_end(engine)["good"]) == REF


# ---- abort ----
def test_abort_ends_the_stream_and_frees_blocks() -> None:
    engine = make_engine()
    engine.add_request(request("a", PROMPT, 12))
    engine.step()
    assert engine.abort("a") and not engine.abort("a")
    out = engine.step().outputs
    assert [(o.request_id, o.finish_reason) for o in out] == [("a", "abort")]
    assert engine.pool.num_used_blocks == 0 and not engine.has_unfinished()
    engine.check_integrity()


# ---- KV events and load ----
def test_kv_events_match_kvhash_chain() -> None:
    engine = make_engine(num_blocks=8)
    engine.add_request(request("a", PROMPT, 7))  # 17 tokens: 4 full blocks computed
    stored: list[BlockStored] = []
    while engine.has_unfinished():
        stored += [e for e in engine.step().kv_events if isinstance(e, BlockStored)]
    seq = PROMPT + REF[:7]
    expect = kvhash.hash_blocks(seq[:16], 4)
    assert [h for e in stored for h in e.block_hashes] == expect
    for e in stored:
        i = expect.index(e.block_hashes[0])
        assert e.parent_block_hash == (expect[i - 1] if i else None)
    assert engine.kv_snapshot()[1:] == [
        BlockStored(
            block_hashes=(h,),
            parent_block_hash=expect[i - 1] if i else None,
            block_size=4,
        )
        for i, h in enumerate(expect)
    ]
    # A new sequence that needs the whole pool evicts them, tail first.
    engine.add_request(request("b", [7] * 28, 4))
    removed: list[int] = []
    while engine.has_unfinished():
        removed += [h for e in engine.step().kv_events if isinstance(e, BlockRemoved) for h in e.block_hashes]
    assert removed == expect[::-1]


def test_load_figures() -> None:
    engine = make_engine(max_num_batched_tokens=8, max_num_seqs=1, num_blocks=32)
    engine.add_request(request("a", list(range(20)), 4))
    engine.add_request(request("b", list(range(5)), 4))
    assert engine.load.num_running == 0 and engine.load.kv_blocks_total == 32
    load = engine.step().load
    assert (load.num_running, load.num_waiting) == (1, 1)
    assert load.tokens_computed == 8 and load.kv_blocks_used == 2
    assert load.queued_prefill_tokens == 12 + 5
    assert load.step_time_s > 0 and load.prefill_tokens_per_s == pytest.approx(8 / load.step_time_s)
    while engine.has_unfinished():
        load = engine.step().load
    assert load.decode_step_s > 0 and load.kv_blocks_used == 0 and load.num_running == 0


# ---- disaggregation: prefill here, decode there ----
def _prefill_only(engine: EngineCore, rid: str, max_tokens: int = 12) -> KVTransferParams:
    sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    kt = KVTransferParams(do_remote_decode=True)
    engine.add_request(GenerateRequest(request_id=rid, token_ids=tuple(PROMPT), sampling=sp, kv_transfer=kt))
    outs = run_to_end(engine)[rid]
    assert tokens(outs) == REF[:1] and outs[-1].finish_reason == "length"
    assert outs[-1].kv_transfer is not None
    return outs[-1].kv_transfer


def _remote(rid: str, kt: KVTransferParams) -> GenerateRequest:
    sp = SamplingParams(max_tokens=12, ignore_eos=True)
    return GenerateRequest(request_id=rid, token_ids=tuple(PROMPT), sampling=sp, kv_transfer=kt)


@pytest.mark.parametrize("early", [False, True])
def test_disaggregated_run_gives_the_aggregated_output(early: bool) -> None:
    prefill, decode = make_engine(), make_engine()
    kt = _prefill_only(prefill, "p")
    assert kt.first_token_id == REF[0] and kt.num_computed_tokens == 10 and len(kt.source_block_ids) == 3
    assert prefill.pool.num_used_blocks == 3  # held for the puller
    blocks, data = prefill.export_request_kv("p")
    assert blocks == list(kt.source_block_ids) and len(data) == 3 * prefill.runner.kv_block_nbytes
    assert prefill.release_request_kv("p") and prefill.pool.num_used_blocks == 0

    decode.add_remote_request(_remote("d", kt))
    if early:  # data arrives before the decode side found blocks for it
        assert decode.finish_remote_kv("d", data)
    decode.step()
    assert "d" in decode.scheduler.remote_parked or early
    if not early:
        assert decode.finish_remote_kv("d", data)
    outs = run_to_end(decode)["d"]
    assert tokens(outs) == REF
    assert outs[0].num_cached_tokens == 10
    prefill.check_integrity()


def test_missing_remote_kv_falls_back_to_local_compute() -> None:
    decode = make_engine()
    kt = KVTransferParams(do_remote_prefill=True, first_token_id=REF[0])
    decode.add_remote_request(_remote("d", kt))
    decode.step()
    decode.finish_remote_kv("d", None)
    outs = run_to_end(decode)["d"]
    assert tokens(outs) == REF and outs[0].num_cached_tokens == 0


def test_unpulled_kv_and_missing_kv_time_out() -> None:
    clock = VirtualClock()
    prefill = make_engine(clock)
    _prefill_only(prefill, "p")
    assert prefill.pool.num_used_blocks == 3
    clock.advance(prefill.kv_hold_timeout_s + 1)
    prefill.step()
    assert prefill.pool.num_used_blocks == 0
    decode = make_engine(clock)
    decode.add_remote_request(_remote("d", KVTransferParams(do_remote_prefill=True, first_token_id=REF[0])))
    decode.step()
    clock.advance(decode.kv_hold_timeout_s + 1)
    assert tokens(run_to_end(decode)["d"]) == REF


def test_factory_builds_a_mock_engine_and_refuses_unknown_runners() -> None:
    from dataclasses import replace

    from interlock.engine.factory import build_engine, build_runner
    from interlock.errors import ConfigError

    config = make_config(num_blocks=32)
    engine = build_engine(config, clock=VirtualClock(), speedup=100.0)
    assert isinstance(engine.runner, MockRunner) and engine.pool.num_blocks == 32
    engine.add_request(request("a", PROMPT, 3))
    assert len(tokens(run_to_end(engine)["a"])) == 3
    with pytest.raises(ConfigError):
        build_runner(replace(config, model=replace(config.model, runner="nope")))


def test_remote_request_already_finished_by_its_first_token() -> None:
    decode = make_engine()
    kt = KVTransferParams(do_remote_prefill=True, first_token_id=REF[0])
    sp = SamplingParams(max_tokens=1, ignore_eos=True)
    decode.add_request(GenerateRequest(request_id="d", token_ids=tuple(PROMPT), sampling=sp, kv_transfer=kt))
    outs = run_to_end(decode)["d"]
    assert [(o.token_ids, o.finish_reason) for o in outs] == [((REF[0],), "length")]
    assert decode.pool.num_used_blocks == 0


# ---- migration: continuing a request another worker started ----
def _resumed(rid: str, done: int, max_tokens: int = 12, **sampling: object) -> GenerateRequest:
    sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True, **sampling)  # type: ignore[arg-type]
    return GenerateRequest(
        request_id=rid, token_ids=tuple(PROMPT), sampling=sp, resume_token_ids=tuple(REF[:done])
    )


@pytest.mark.parametrize("done", [1, 5, 11])
def test_a_resumed_request_streams_only_what_comes_after(done: int) -> None:
    engine = make_engine()
    engine.add_request(_resumed("r", done))
    outs = run_to_end(engine)["r"]
    assert tokens(outs) == REF[done:]
    assert outs[-1].finish_reason == "length" and outs[-1].num_prompt_tokens == len(PROMPT)
    assert engine.pool.num_used_blocks == 0 or engine.pool.check_integrity() is None


def test_resume_tokens_count_against_the_budget_and_min_tokens() -> None:
    engine = make_engine()
    engine.add_request(_resumed("full", 12))  # nothing left to generate: finished at once
    outs = run_to_end(engine)["full"]
    assert tokens(outs) == [] and outs[-1].finish_reason == "length"
    eos = REF[7]
    for min_tokens, want in ((8, (REF[6:8], "stop")), (9, (REF[6:], "length"))):  # EOS is the 8th token
        sp = SamplingParams(max_tokens=12, min_tokens=min_tokens)
        r = GenerateRequest(
            request_id="m", token_ids=tuple(PROMPT), sampling=sp, resume_token_ids=tuple(REF[:6])
        )
        assert _final(_engine_with_eos(eos), r) == want


def test_bad_resume_tokens_are_refused() -> None:
    engine = make_engine()
    engine.add_request(_resumed("many", 5, max_tokens=4))
    engine.add_request(
        GenerateRequest(request_id="range", token_ids=tuple(PROMPT), resume_token_ids=(VOCAB + 1,))
    )
    outs = run_to_end(engine)
    for rid in ("many", "range"):
        assert outs[rid][-1].error is not None and outs[rid][-1].error.status == 400


def test_token_ids_are_checked_whole_on_long_prompts_too() -> None:
    from interlock.engine.core import ids_within

    for n in (3, 600):  # below and above the packed path's threshold
        assert ids_within([VOCAB - 1] * n, VOCAB)
        assert not ids_within([1] * n + [VOCAB], VOCAB)
        assert not ids_within([1] * n + [-1], VOCAB)
        assert not ids_within([-(1 << 40)] + [1] * n, VOCAB)
        assert not ids_within([1 << 40] + [1] * n, VOCAB)


def test_a_long_prompts_packing_for_the_check_gives_its_block_hashes() -> None:
    from interlock import kvhash
    from interlock.engine.core import pack_within
    from interlock.engine.request import Request
    from interlock.protocol import SamplingParams

    ids = [(i * 7919) % VOCAB for i in range(40 * 16 + 5)]
    within, packed = pack_within(ids, VOCAB)
    assert within and packed is not None and len(packed) == 4 * len(ids)
    request = Request("r", tuple(ids), SamplingParams(), block_size=16, packed=packed)
    assert request.block_hashes == kvhash.hash_blocks(ids, 16)
    assert pack_within(ids[:10], VOCAB) == (True, None)  # a short prompt is not packed
