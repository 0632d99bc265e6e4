from array import array

import msgspec
import pytest

import interlock.protocol as p
from interlock.errors import InvalidRequest
from interlock.protocol import packed_ids
from interlock.protocol.generate import decode_request, encode_request


def test_public_api_is_pinned():
    assert sorted(p.__all__) == sorted(
        [
            "AllBlocksCleared",
            "BlockRemoved",
            "BlockStored",
            "ErrorInfo",
            "GenerateOutput",
            "GenerateRequest",
            "InstanceInfo",
            "KVEvent",
            "KVEventBatch",
            "KVTransferParams",
            "LoadReport",
            "SamplingParams",
            "StructuredOutput",
            "TierStats",
            "TokenLogprobs",
        ]
    )


def test_generate_round_trip():
    req = p.GenerateRequest(request_id="r1", token_ids=[1, 2, 3], sampling=p.SamplingParams(seed=7))
    # Whatever sequence it was built from, a worker reads the ids as an array('I') (packed_ids)
    for ids in ([1, 2, 3], (1, 2, 3), packed_ids.pack([1, 2, 3])):
        got = decode_request(encode_request(msgspec.structs.replace(req, token_ids=ids)))
        assert got == msgspec.structs.replace(req, token_ids=array("I", [1, 2, 3]))


def test_prompt_logprobs_round_trip_and_older_peers_still_decode():
    sampling = p.SamplingParams(max_tokens=2, prompt_logprobs=3)
    req = p.GenerateRequest(request_id="r", token_ids=array("I", [1, 2, 3]), sampling=sampling)
    assert decode_request(encode_request(req)) == req
    assert req.needs_local_prefill
    assert not msgspec.structs.replace(req, resume_token_ids=(4,)).needs_local_prefill
    assert not p.GenerateRequest(request_id="r", token_ids=(1,)).needs_local_prefill
    entries = (p.TokenLogprobs(2, -1.5, ((7, -0.5), (2, -1.5))), p.TokenLogprobs(3, -0.25, ()))
    out = p.GenerateOutput(request_id="r", token_ids=(9,), num_prompt_tokens=3, prompt_logprobs=entries)
    for codec in (msgspec.msgpack, msgspec.json):
        assert codec.decode(codec.encode(out), type=p.GenerateOutput) == out
    # a peer without the field sends none: decoded as None
    old = msgspec.msgpack.encode({"request_id": "r", "token_ids": [9]})
    assert msgspec.msgpack.decode(old, type=p.GenerateOutput).prompt_logprobs is None


def test_event_batch_round_trip_keeps_tags():
    batch = p.KVEventBatch(
        instance_id="w",
        seq=3,
        timestamp=1.0,
        events=(
            p.AllBlocksCleared(),
            p.BlockStored(block_hashes=(1, 2), parent_block_hash=None),
            p.BlockRemoved(block_hashes=(2,)),
        ),
    )
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(batch), type=p.KVEventBatch) == batch


def test_tier_events_and_figures_round_trip():
    batch = p.KVEventBatch(
        instance_id="w",
        seq=4,
        timestamp=1.0,
        events=(
            p.BlockStored(block_hashes=(1,), parent_block_hash=None, tier="host"),
            p.BlockRemoved(block_hashes=(1,), tier="disk"),
        ),
    )
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(batch), type=p.KVEventBatch)
    assert decoded == batch and [e.tier for e in decoded.events] == ["host", "disk"]
    load = p.LoadReport(
        instance_id="w",
        timestamp=0.0,
        num_running=0,
        num_waiting=0,
        kv_blocks_used=0,
        kv_blocks_total=8,
        queued_prefill_tokens=0,
        step_time_s=0.0,
        tokens_computed=0,
        kv_tiers=(p.TierStats(tier="host", blocks=3, capacity=8, hits=2),),
    )
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(load), type=p.LoadReport) == load


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_tokens": 0},
        {"temperature": -1},
        {"top_p": 0},
        {"top_k": -5},
        {"min_p": 2},
        {"logprobs": 50},
        {"min_tokens": 100, "max_tokens": 10},
    ],
)
def test_bad_sampling_is_invalid_request(kwargs):
    with pytest.raises(InvalidRequest):
        p.SamplingParams(**kwargs).validate()
