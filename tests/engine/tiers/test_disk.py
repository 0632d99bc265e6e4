from __future__ import annotations

import os
from pathlib import Path

import pytest

from interlock.engine.tiers.disk import (
    HEADER_BYTES,
    DiskTier,
    block_path,
    layout_digest,
    read_block,
    write_block,
)
from interlock.engine.tiers.io import ManualIO
from interlock.errors import ConfigError

LAYOUT = layout_digest("mock|bs=4")


def test_round_trip_and_every_corruption_reads_as_missing(tmp_path: Path) -> None:
    data = bytes(range(64))
    write_block(tmp_path, 7, LAYOUT, data)
    assert read_block(tmp_path, 7, LAYOUT, 64) == data
    assert read_block(tmp_path, 7, layout_digest("other"), 64) is None  # another model's file
    assert read_block(tmp_path, 8, LAYOUT, 64) is None  # missing
    path = block_path(tmp_path, 7)
    raw = bytearray(path.read_bytes())
    raw[HEADER_BYTES + 3] ^= 0xFF  # one flipped payload bit
    path.write_bytes(raw)
    assert read_block(tmp_path, 7, LAYOUT, 64) is None
    write_block(tmp_path, 7, LAYOUT, data)
    path.write_bytes(path.read_bytes()[:-1])  # torn write
    assert read_block(tmp_path, 7, LAYOUT, 64) is None
    os.rename(block_path(tmp_path, 7), block_path(tmp_path, 9))  # a file under another name
    assert read_block(tmp_path, 9, LAYOUT, 63) is None


def test_reads_into_a_reused_buffer_check_as_fresh_ones_do(tmp_path: Path) -> None:
    scratch = bytearray(HEADER_BYTES + 64 + 1)
    for h in range(3):
        write_block(tmp_path, h, LAYOUT, bytes([h]) * 64)
    for h in (2, 0, 1):
        assert read_block(tmp_path, h, LAYOUT, 64, scratch) == bytes([h]) * 64
    path = block_path(tmp_path, 1)
    path.write_bytes(path.read_bytes() + b"x")  # one byte too many
    assert read_block(tmp_path, 1, LAYOUT, 64, scratch) is None
    assert read_block(tmp_path, 1, LAYOUT, 64) is None
    write_block(tmp_path, 1, LAYOUT, bytes([1]) * 64)
    path.write_bytes(path.read_bytes()[:-1])  # one byte short
    assert read_block(tmp_path, 1, LAYOUT, 64, scratch) is None
    # A buffer too small for this layout is not used (a fresh one is).
    assert read_block(tmp_path, 2, LAYOUT, 64, bytearray(8)) == bytes([2]) * 64


def test_writes_become_readable_when_done_and_lru_deletes_files(tmp_path: Path) -> None:
    io = ManualIO()
    tier = DiskTier(tmp_path, 2, 8, "mock", io)
    assert tier.put(1, b"a" * 8) == (True, [])
    assert 1 not in tier and tier.is_writing(1)
    assert tier.put(2, b"b" * 8) == (True, [])
    assert tier.put(3, b"c" * 8) == (False, [])  # both entries still being written
    io.run_pending()
    assert tier.poll() == ([1, 2], [])
    assert 1 in tier and 2 in tier
    tier.touch(1)
    assert tier.put(3, b"c" * 8) == (True, [2])
    io.run_pending()
    tier.poll()
    assert not block_path(tier.directory, 2).exists()
    assert read_block(*tier.reader(3)) == b"c" * 8
    tier.check_integrity()
    tier.close()


def test_a_pinned_block_outlives_clear_until_its_reads_are_over(tmp_path: Path) -> None:
    io = ManualIO()
    tier = DiskTier(tmp_path, 4, 8, "mock", io)
    tier.put(1, b"a" * 8)
    tier.put(2, b"b" * 8)
    io.run_pending()
    tier.poll()
    tier.acquire(1)
    tier.acquire(1)
    assert tier.num_pinned == 2
    assert tier.clear() == [2] and 1 in tier and 2 not in tier
    tier.release(1)
    tier.release(1)
    tier.check_integrity()
    assert tier.num_pinned == 0 and tier.clear() == [1] and len(tier) == 0
    tier.close()


def test_a_failed_write_is_forgotten(tmp_path: Path) -> None:
    io = ManualIO()
    tier = DiskTier(tmp_path, 2, 8, "mock", io)
    tier.put(1, b"a" * 8)
    (tier.directory / "0000000000000001.kv").mkdir()  # the rename onto it fails
    io.run_pending()
    assert tier.poll() == ([], [1])
    assert 1 not in tier and len(tier) == 0 and tier.write_failures == 1
    tier.check_integrity()
    tier.close()


def test_each_worker_takes_its_own_slot_and_leftovers_are_cleaned(tmp_path: Path) -> None:
    old = tmp_path / "slot-0"
    old.mkdir()
    (old / "0000000000000005.kv").write_bytes(b"old")
    (old / "0000000000000006.123.tmp").write_bytes(b"half")
    first = DiskTier(tmp_path, 2, 8, "mock", ManualIO())
    assert first.directory == old and sorted(p.name for p in old.iterdir()) == [".lock"]
    second = DiskTier(tmp_path, 2, 8, "mock", ManualIO())
    assert second.directory == tmp_path / "slot-1"
    first.close()  # (a dead worker's lock goes with its process)
    assert DiskTier(tmp_path, 2, 8, "mock", ManualIO()).directory == old
    second.close()


def test_an_unusable_path_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(ConfigError, match="not usable"):
        DiskTier(tmp_path / "file" / "kv", 2, 8, "mock", ManualIO())
