from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from interlock.errors import ConfigError
from interlock.mooncake import (
    MooncakeRecord,
    arrival_offsets,
    block_indices,
    load_mooncake,
    prompt_indices,
)

ROWS = [
    {"timestamp": 1000, "input_length": 700, "output_length": 3, "hash_ids": [0, 1]},
    {"timestamp": 1100, "input_length": 1100, "output_length": 2, "hash_ids": [0, 1, 2]},
    {"timestamp": 1300, "input_length": 600, "output_length": 4, "hash_ids": [0, 3]},
    {"timestamp": 1600, "input_length": 100, "output_length": 1, "hash_ids": [4]},
]


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n\n")
    return path


def test_load(trace: Path) -> None:
    recs = load_mooncake(trace)
    assert recs[1] == MooncakeRecord(1100.0, 1100, 2, (0, 1, 2)) and len(recs) == 4
    assert load_mooncake(trace, limit=2) == recs[:2]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('{"timestamp": 0}\n', "bad.jsonl:1"),
        ('{"timestamp": 0, "input_length": 5, "output_length": 1}\nnot json\n', "bad.jsonl:2"),
        ("\n", "no requests"),
    ],
)
def test_bad_traces_are_config_errors(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_mooncake(path)


def test_speedup_divides_inter_arrival_times(trace: Path) -> None:
    recs = load_mooncake(trace)
    assert arrival_offsets(recs) == pytest.approx([0.0, 0.1, 0.3, 0.6])
    assert arrival_offsets(recs, 2.0) == pytest.approx([0.0, 0.05, 0.15, 0.3])
    with pytest.raises(ConfigError, match="speed-up"):
        arrival_offsets(recs, 0.0)


def test_equal_ids_give_equal_blocks_and_prompts_share_prefixes(trace: Path) -> None:
    assert np.array_equal(block_indices(17, 100), block_indices(17, 100))
    assert not np.array_equal(block_indices(17, 100), block_indices(18, 100))
    assert block_indices(17, 100).max() < 100 and len(block_indices(17, 100)) == 512
    recs = load_mooncake(trace)
    p = [prompt_indices(r, i, 1000).tolist() for i, r in enumerate(recs)]
    assert [len(x) for x in p] == [r.input_length for r in recs]
    assert p[0] == p[1][:700] and p[0][:512] == p[2][:512] and p[2][512:] != p[0][512:600]
    assert p[3] == block_indices(4, 1000)[:100].tolist()


def test_a_prompt_longer_than_its_blocks_is_padded_uniquely() -> None:
    rec = MooncakeRecord(0.0, 600, 1, (7,))
    a, b = prompt_indices(rec, 0, 1000), prompt_indices(rec, 1, 1000)
    assert len(a) == 600 and a[:512].tolist() == b[:512].tolist() == block_indices(7, 1000).tolist()
    assert a[512:].tolist() != b[512:].tolist()


def test_blocks_indices_is_block_indices_one_after_another() -> None:
    from interlock.mooncake import blocks_indices

    ids = [0, 17, 18, 2**40 + 3]
    assert np.array_equal(
        blocks_indices(ids, 1000, 64), np.concatenate([block_indices(h, 1000, 64) for h in ids])
    )
