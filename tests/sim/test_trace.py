from __future__ import annotations

import json
from pathlib import Path

from interlock.kvhash import hash_blocks
from interlock.mooncake import MooncakeRecord, load_mooncake, prompt_indices
from interlock.sim.trace import VOCAB_SIZE, TraceHasher, mooncake_requests


def write_trace(path: Path) -> Path:
    rows = [
        {"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1, 2]},
        {"timestamp": 3000, "input_length": 1500, "output_length": 0, "hash_ids": [0, 1, 3]},
        {"timestamp": 3000, "input_length": 200, "output_length": 7, "hash_ids": [4]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_records_become_requests(tmp_path: Path) -> None:
    recs = load_mooncake(write_trace(tmp_path / "t.jsonl"))
    reqs = mooncake_requests(recs, block_size=64, speedup=2.0)
    assert [r.arrival_s for r in reqs] == [0.0, 1.5, 1.5]
    assert [len(r.block_hashes) for r in reqs] == [1100 // 64, 1500 // 64, 200 // 64]
    assert reqs[1].output_tokens == 1  # at least one output token
    with_tokens = mooncake_requests(recs, block_size=64, with_tokens=True)
    assert [len(r.token_ids or ()) for r in with_tokens] == [1100, 1500, 200]


def test_memoised_hashes_equal_hashing_the_expanded_tokens(tmp_path: Path) -> None:
    recs = load_mooncake(write_trace(tmp_path / "t.jsonl"))
    # and a prompt longer than its hash ids: padded with tokens of its own
    recs.append(MooncakeRecord(0.0, 1200, 1, (0,)))
    hasher = TraceHasher(64)
    for i, rec in enumerate(recs):
        tokens = prompt_indices(rec, i, VOCAB_SIZE)
        assert len(tokens) == rec.input_length
        assert list(hasher.hashes(rec, i)) == hash_blocks(tokens, 64)
    a, b, _, padded = (hasher.hashes(r, i) for i, r in enumerate(recs))
    assert a[:16] == b[:16] and a[16] != b[16]  # ids 0, 1 shared: 1024 tokens = 16 blocks
    assert padded[:8] == a[:8] and padded[8] != a[8] and len(padded) == 1200 // 64


def test_compiled_trace_hashes_equal_the_numpy_expansion(monkeypatch) -> None:
    from interlock.sim import trace
    from interlock.sim.synthetic import AgentSpec, agent_records

    recs = agent_records(AgentSpec(num_sessions=12, seed=3))
    assert trace._compiled_trace_hashes()  # this machine has a compiler: the C path is tested
    for block_size in (16, 64):
        fast = [r.block_hashes for r in mooncake_requests(recs, block_size=block_size)]
        with monkeypatch.context() as m:
            m.setattr(trace, "trace_hash_chain", lambda *a: None)
            slow = [r.block_hashes for r in mooncake_requests(recs, block_size=block_size)]
        assert fast == slow and sum(map(len, fast)) > 1000
