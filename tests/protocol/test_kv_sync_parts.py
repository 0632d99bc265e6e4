"""A pulled KV state's parts: block hashes packed as unsigned 64-bit little-endian ints."""

from __future__ import annotations

from array import array

import msgspec
import pytest

from interlock.protocol.kv_sync import KvSnapshotPart, pack_hashes, snapshot_parts, unpack_hashes

EDGES = [0, 1, 2**32, 2**63, 2**64 - 1]


def test_hashes_are_packed_in_8_bytes_each_and_read_back_as_an_array() -> None:
    packed = pack_hashes(EDGES)
    assert len(packed) == 8 * len(EDGES) and packed[:8] == b"\0" * 8 and packed[8:16] == b"\1" + b"\0" * 7
    got = unpack_hashes(packed)
    assert isinstance(got, array) and got.typecode == "Q" and got.tolist() == EDGES
    assert unpack_hashes(pack_hashes([7, 8]), into=got).tolist() == [*EDGES, 7, 8]


def test_a_state_goes_in_parts_of_a_bounded_size_over_msgpack() -> None:
    hashes = list(range(1, 2_501))
    parts = snapshot_parts({"device": hashes, "host": [5, 6]}, part_blocks=1_000)
    assert [(p.tier, p.blocks) for p in parts] == [
        ("device", 1000),
        ("device", 1000),
        ("device", 500),
        ("host", 2),
    ]
    wire = [msgspec.msgpack.encode(p) for p in parts]
    decode = msgspec.msgpack.Decoder(KvSnapshotPart).decode
    back: dict[str, array[int]] = {}
    for frame in wire:
        part = decode(frame)
        back[part.tier] = unpack_hashes(part.hashes, back.get(part.tier))
    assert back["device"].tolist() == hashes and back["host"].tolist() == [5, 6]
    assert sum(map(len, wire)) < 8.01 * 2_502 + 64  # 8 bytes a block and a few of framing


@pytest.mark.parametrize("bad", [-1, 2**64])
def test_a_hash_outside_64_bits_cannot_be_packed(bad: int) -> None:
    with pytest.raises(OverflowError):
        pack_hashes([1, bad])


def test_a_part_that_is_not_whole_hashes_is_refused() -> None:
    with pytest.raises(ValueError, match="not a multiple of 8"):
        unpack_hashes(b"\0" * 12)
