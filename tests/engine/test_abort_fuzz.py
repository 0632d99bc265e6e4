"""Abort requests at random points (waiting, mid-prefill, decoding, preempted, parked, held):
the pool must stay intact and end with every block free or cached."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from interlock.engine.core import EngineCore
from interlock.protocol import GenerateRequest, KVTransferParams, SamplingParams
from tests.engine.conftest import VOCAB, make_engine


def _random_request(rng: random.Random, i: int) -> tuple[GenerateRequest, bool]:
    shared = [1, 2, 3, 4, 5, 6, 7, 8] if rng.random() < 0.5 else []  # some prefix hits
    prompt = shared + [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 30))]
    sp = SamplingParams(max_tokens=rng.randrange(1, 12), ignore_eos=rng.random() < 0.8)
    kind = rng.random()
    kt = None
    if kind < 0.15:
        kt = KVTransferParams(do_remote_decode=True)
    elif kind < 0.3:
        kt = KVTransferParams(do_remote_prefill=True, first_token_id=rng.randrange(VOCAB))
    req = GenerateRequest(request_id=f"r{i}", token_ids=tuple(prompt), sampling=sp, kv_transfer=kt)
    return req, kind >= 0.15 and kind < 0.3


def _fuzz(engine: EngineCore, rng: random.Random, steps: int) -> None:
    live: list[str] = []
    for i in range(steps):
        if rng.random() < 0.5:
            req, remote = _random_request(rng, i)
            (engine.add_remote_request if remote else engine.add_request)(req)
            live.append(req.request_id)
        if live and rng.random() < 0.3:
            engine.abort(live.pop(rng.randrange(len(live))))
        if live and rng.random() < 0.1:  # remote KV arrives (or not) for a random parked one
            engine.finish_remote_kv(rng.choice(live), None)
        if live and rng.random() < 0.1:
            engine.release_request_kv(rng.choice(live))
        engine.step()
        engine.check_integrity()
    for rid in live:
        engine.abort(rid)
        engine.release_request_kv(rid)
    while engine.has_unfinished():
        engine.step()
    engine.check_integrity()
    assert engine.pool.num_used_blocks == 0
    assert engine.pool.num_free_blocks == engine.pool.num_blocks
    assert not engine.scheduler.requests and not engine.scheduler.held


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), num_blocks=st.sampled_from([12, 20, 64]))
def test_random_aborts_leave_the_pool_intact(seed: int, num_blocks: int) -> None:
    engine = make_engine(num_blocks=num_blocks, max_num_batched_tokens=16, max_num_seqs=6, max_model_len=64)
    _fuzz(engine, random.Random(seed), steps=80)
