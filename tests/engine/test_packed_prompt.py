"""A prompt's ids cross the request plane packed (``protocol.packed_ids``): what the router
sends, what a worker reads back, what an older peer's list still does, and what a malformed
payload costs (a clear error, and the worker serves on)."""

from __future__ import annotations

import asyncio
from array import array

import msgspec
import pytest

from interlock import kvhash
from interlock.engine.runners.mock import reference_output
from interlock.errors import InvalidRequest
from interlock.protocol import GenerateOutput, GenerateRequest, SamplingParams, packed_ids
from interlock.protocol.generate import decode_request as _decode_request
from interlock.protocol.generate import encode_request as _encode
from interlock.router.dispatcher import _packed
from interlock.runtime import InProcRegistry, connect_runtime
from tests.engine.conftest import VOCAB, make_engine, request, run_to_end, timed_worker, tokens

PROMPT = tuple(range(300, 300 + 37))
_decode_output = msgspec.msgpack.Decoder(GenerateOutput).decode
_plain = msgspec.msgpack.Encoder().encode


def test_the_router_sends_packed_ids_and_the_worker_reads_an_array() -> None:
    ids = tuple(range(100, 100 + packed_ids.MEMO_TOKENS))
    req = _packed(request("a", ids))
    assert isinstance(req.token_ids, array) and req.token_ids.typecode == "I"
    raw = _encode(req)
    assert kvhash.u32_bytes(ids) in raw  # 4 bytes an id, little-endian
    got = _decode_request(raw)
    assert isinstance(got.token_ids, array) and tuple(got.token_ids) == ids
    assert got.sampling == req.sampling and got.request_id == "a"
    # A long prompt sent again (the frontend's cache gives the same tuple) packs once.
    assert _packed(request("b", ids)).token_ids is req.token_ids
    assert _packed(request("c", tuple(ids))).token_ids is req.token_ids  # tuple(t) is t
    assert _packed(request("d", list(ids))).token_ids is not req.token_ids


def test_an_older_peers_list_is_read_and_ids_no_uint32_holds_are_malformed() -> None:
    got = _decode_request(_plain(request("a", PROMPT)))
    assert isinstance(got.token_ids, array) and tuple(got.token_ids) == PROMPT
    for ids in ((5, -1, 7), (5, 1 << 32), (5, 1 << 63), (*range(600), -(1 << 32) + 5)):
        with pytest.raises(msgspec.ValidationError, match=r"integers in \[0, 2\*\*32\)"):
            _decode_request(_plain(request("bad", ids)))
    assert _packed(request("c", (5, -1))).token_ids == (5, -1)  # sent as a list, refused there
    engine = make_engine()  # ids a uint32 holds but past the vocabulary: the engine's to refuse
    engine.add_request(_decode_request(_encode(_packed(request("big", (5, VOCAB + 1))))))
    engine.add_request(_decode_request(_encode(_packed(request("long", (*range(600), 1 << 31))))))
    errors = {rid: o[-1].error for rid, o in run_to_end(engine).items()}
    assert {rid: e.code for rid, e in errors.items() if e} == {
        "big": "invalid_request",
        "long": "invalid_request",
    }


@pytest.mark.parametrize("length", [1, 200, 600, 5000])
def test_a_packed_prompt_generates_what_a_tuple_does(length: int) -> None:
    prompt = tuple((7 * i + 11) % (VOCAB - 3) + 3 for i in range(length))
    want = reference_output(prompt, 6, vocab_size=VOCAB)
    for sent in (request("t", prompt, 6), _decode_request(_encode(_packed(request("t", prompt, 6))))):
        engine = make_engine(num_blocks=2048, max_model_len=8192)
        engine.add_request(sent)
        assert tokens(run_to_end(engine)["t"]) == want


def test_malformed_packed_ids_are_refused_by_name() -> None:
    good = msgspec.msgpack.decode(_encode(_packed(request("a", PROMPT))))
    good["token_ids"] = good["token_ids"][:-1]  # 147 bytes: not whole ids
    with pytest.raises(msgspec.ValidationError, match="4 bytes each"):
        _decode_request(_plain(good))
    good["token_ids"] = "ids"
    with pytest.raises(msgspec.ValidationError, match="packed bytes or an array"):
        _decode_request(_plain(good))


def test_a_worker_answers_a_malformed_request_with_a_clear_error_and_serves_on() -> None:
    async def main() -> None:
        registry = InProcRegistry()
        rt = await connect_runtime(None, registry=registry)
        worker = timed_worker("w", rt, speedup=1000.0)
        info = await worker.start()
        try:
            assert info.metadata["prompt_ids"] == "packed"  # the router packs for it
            raw = msgspec.msgpack.decode(_encode(_packed(request("bad", PROMPT))))
            raw["token_ids"] = raw["token_ids"][:5]
            with pytest.raises(InvalidRequest, match="malformed generate request.*4 bytes each"):
                async with asyncio.timeout(5):
                    async for _ in rt.requests.stream(info.address, _plain(raw)):
                        pass
            out: list[int] = []
            async with asyncio.timeout(5):
                async for chunk in rt.requests.stream(
                    info.address, _encode(_packed(request("ok", PROMPT, 4)))
                ):
                    out += _decode_output(chunk).token_ids
            assert out == reference_output(PROMPT, 4, vocab_size=VOCAB)
        finally:
            await worker.close()
            await rt.close()

    asyncio.run(main())


def test_requests_built_in_python_keep_any_sequence() -> None:
    """Python callers (the API, tests, the simulator) build requests from tuples or lists:
    nothing packs them until the router sends them."""
    req = GenerateRequest(request_id="a", token_ids=[1, 2, 3], sampling=SamplingParams(max_tokens=2))
    assert req.token_ids == [1, 2, 3]
    assert tuple(_decode_request(_encode(req)).token_ids) == (1, 2, 3)


def test_an_older_worker_that_does_not_announce_packed_ids_gets_a_list() -> None:
    ids = packed_ids.pack(PROMPT)
    assert packed_ids.for_peer(ids, {"prompt_ids": "packed", "engine": "mock"}) is ids
    old = packed_ids.for_peer(ids, {"engine": "mock"})
    assert type(old) is list and old == list(PROMPT)
    assert packed_ids.for_peer(PROMPT, {}) is PROMPT
    sent = _encode(_packed(request("a", PROMPT)))
    legacy = msgspec.structs.replace(_packed(request("a", PROMPT)), token_ids=old)
    assert _plain(legacy) == _encode(legacy) != sent  # what an older worker always read
    assert msgspec.msgpack.decode(_plain(legacy))["token_ids"] == list(PROMPT)
