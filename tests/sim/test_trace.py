from __future__ import annotations

import json
from pathlib import Path

from interlock.kvhash import hash_blocks
from interlock.sim.trace import (
    TraceHasher,
    load_mooncake,
    mooncake_requests,
    record_token_ids,
)


def write_trace(path: Path) -> Path:
    rows = [
        {"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1, 2]},
        {"timestamp": 3000, "input_length": 1500, "output_length": 0, "hash_ids": [0, 1, 3]},
        {"timestamp": 3000, "input_length": 200, "output_length": 7, "hash_ids": [4]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_load_and_convert(tmp_path: Path) -> None:
    recs = load_mooncake(write_trace(tmp_path / "t.jsonl"))
    assert len(recs) == 3 and recs[1].hash_ids == (0, 1, 3)
    reqs = mooncake_requests(recs, block_size=64, speedup=2.0)
    assert [r.arrival_s for r in reqs] == [0.0, 1.5, 1.5]
    assert [len(r.block_hashes) for r in reqs] == [1100 // 64, 1500 // 64, 200 // 64]
    assert reqs[1].output_tokens == 1  # at least one output token
    assert load_mooncake(tmp_path / "t.jsonl", limit=2)[-1].hash_ids == (0, 1, 3)


def test_memoised_hashes_equal_hashing_the_expanded_tokens(tmp_path: Path) -> None:
    recs = load_mooncake(write_trace(tmp_path / "t.jsonl"))
    hasher = TraceHasher(64)
    for rec in recs:
        tokens = record_token_ids(rec)
        assert len(tokens) == rec.input_length
        assert list(hasher.hashes(rec)) == hash_blocks(tokens, 64)
    a, b = (hasher.hashes(r) for r in recs[:2])
    assert a[:16] == b[:16] and a[16] != b[16]  # ids 0, 1 shared: 1024 tokens = 16 blocks
