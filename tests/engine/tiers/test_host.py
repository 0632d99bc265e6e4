from __future__ import annotations

import numpy as np
import pytest

from interlock.engine.tiers.host import HostTier


def _fill(value: int):
    def fill(mv: memoryview) -> None:
        np.frombuffer(mv, dtype=np.uint8)[:] = value

    return fill


def _read(tier: HostTier, h: int) -> bytes:
    handle = tier.acquire(h)
    assert handle is not None
    out: list[bytes] = []
    tier.read(handle, lambda mv: out.append(bytes(mv)))
    tier.release(handle)
    return out[0]


def test_read_many_hands_out_every_pinned_slot_at_once() -> None:
    tier = HostTier(3, 8)
    for h in (5, 6, 7):
        tier.store(h, _fill(h), keep_evicted=False)
    handles = [tier.acquire(h) for h in (7, 5)]
    got: list[bytes] = []
    assert tier.read_many(handles, lambda views: got.extend(bytes(v) for v in views)) == 2  # type: ignore[arg-type]
    assert got == [b"\x07" * 8, b"\x05" * 8]
    for h in handles:
        tier.release(h)  # type: ignore[arg-type]
    tier.check_integrity()


def test_store_evicts_lru_and_hands_out_the_victims_bytes() -> None:
    tier = HostTier(2, 4)
    assert tier.store(1, _fill(1), keep_evicted=True) == (True, [])
    assert tier.store(2, _fill(2), keep_evicted=True) == (True, [])
    tier.touch(1)
    stored, evicted = tier.store(3, _fill(3), keep_evicted=True)
    assert stored and evicted == [(2, b"\x02" * 4)]
    assert 1 in tier and 3 in tier and 2 not in tier
    assert _read(tier, 1) == b"\x01" * 4 and _read(tier, 3) == b"\x03" * 4
    tier.check_integrity()


def test_pinned_slots_are_never_overwritten() -> None:
    tier = HostTier(1, 4)
    tier.store(1, _fill(1), keep_evicted=False)
    handle = tier.acquire(1)
    assert handle is not None
    assert tier.store(2, _fill(2), keep_evicted=False) == (False, [])
    assert not tier.remove(1)
    tier.release(handle)
    assert tier.store(2, _fill(2), keep_evicted=False) == (True, [(1, None)])
    tier.check_integrity()


def test_storing_a_held_block_only_touches_it() -> None:
    tier = HostTier(2, 4)
    tier.store(1, _fill(1), keep_evicted=False)
    tier.store(2, _fill(2), keep_evicted=False)
    assert tier.store(1, _fill(9), keep_evicted=False) == (False, [])
    assert tier.hashes() == [2, 1] and _read(tier, 1) == b"\x01" * 4
    assert sorted(tier.clear()) == [1, 2] and len(tier) == 0
    tier.check_integrity()


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError):
        HostTier(0, 4)
