"""The host tier shared by the workers of a host: one segment, many attachments, any of them
killed at any moment."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from interlock.engine.tiers.disk import layout_digest
from interlock.engine.tiers.shared import WRITING, SharedHostTier
from interlock.errors import ConfigError

LAYOUT = layout_digest("mock|bs=4")
NB = 16


def fill(value: int):
    def f(mv: memoryview) -> None:
        np.frombuffer(mv, dtype=np.uint8)[:] = value

    return f


def read(tier: SharedHostTier, h: int) -> bytes | None:
    handle = tier.acquire(h)
    if handle is None:
        return None
    out: list[bytes] = []
    ok = tier.read(handle, lambda mv: out.append(bytes(mv)))
    tier.release(handle)
    return out[0] if ok else None


@pytest.fixture
def seg(tmp_path: Path) -> Path:
    return tmp_path / "seg"


def test_what_one_worker_stores_another_reads(seg: Path) -> None:
    a, b = SharedHostTier(seg, 2, NB, LAYOUT), SharedHostTier(seg, 99, NB, LAYOUT)
    assert b.capacity == 2  # the segment's size wins
    assert a.store(1, fill(1), keep_evicted=False) == (True, [])
    assert 1 in b and read(b, 1) == b"\x01" * NB
    assert b.store(1, fill(9), keep_evicted=False) == (False, [])  # already there: touched
    b.store(2, fill(2), keep_evicted=False)
    a.touch(1)
    stored, evicted = b.store(3, fill(3), keep_evicted=True)
    assert stored and evicted == [(2, b"\x02" * NB)]
    assert sorted(a.hashes()) == [1, 3] and read(a, 3) == b"\x03" * NB
    a.check_integrity()
    a.close()
    b.close()


def test_a_read_overtaken_by_a_write_is_discarded(seg: Path) -> None:
    a, b = SharedHostTier(seg, 1, NB, LAYOUT), SharedHostTier(seg, 1, NB, LAYOUT)
    a.store(1, fill(1), keep_evicted=False)
    handle = b.acquire(1)
    assert handle is not None
    # While b copies, a evicts block 1 for block 2 in the only slot.
    ok = b.read(handle, lambda mv: a.store(2, fill(2), keep_evicted=False))
    b.release(handle)
    assert not ok and 1 not in b and read(b, 2) == b"\x02" * NB
    handle = a.acquire(2)  # a's own stores never take a slot a is reading
    assert a.store(3, fill(3), keep_evicted=False) == (False, [])
    a.release(handle)  # type: ignore[arg-type]
    assert a.store(3, fill(3), keep_evicted=False)[0]
    a.close()
    b.close()


def test_read_many_keeps_the_leading_blocks_no_write_overtook(seg: Path) -> None:
    a, b = SharedHostTier(seg, 3, NB, LAYOUT), SharedHostTier(seg, 3, NB, LAYOUT)
    for h in (1, 2, 3):
        a.store(h, fill(h), keep_evicted=False)
    handles = [b.acquire(h) for h in (1, 2, 3)]
    assert all(h is not None for h in handles)
    got: list[bytes] = []
    assert b.read_many(handles, lambda views: got.extend(bytes(v) for v in views)) == 3
    assert got == [bytes([h]) * NB for h in (1, 2, 3)]

    def overtaken(views: list[memoryview]) -> None:  # while b copies, a replaces block 2
        assert a.remove(2) and a.store(4, fill(4), keep_evicted=False)[0]

    assert b.read_many(handles, overtaken) == 1
    assert b.read_many(handles[1:], overtaken) == 0  # changed before the copy: not even started
    for h in handles:
        b.release(h)  # type: ignore[arg-type]
    b.check_integrity()
    a.close()
    b.close()


def test_another_layout_is_refused(seg: Path) -> None:
    SharedHostTier(seg, 2, NB, LAYOUT).close()
    with pytest.raises(ConfigError, match="another model"):
        SharedHostTier(seg, 2, NB, layout_digest("other"))
    with pytest.raises(ConfigError, match="another model"):
        SharedHostTier(seg, 2, NB * 2, LAYOUT)


_CHILD = """
import sys, time, pathlib
from interlock.engine.tiers.shared import SharedHostTier
from interlock.engine.tiers.disk import layout_digest
seg, marker, mode = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3]
t = SharedHostTier(seg, 2, 16, layout_digest("mock|bs=4"))
def hang(mv):
    mv[:4] = b"junk"
    marker.write_text("x")
    time.sleep(60)
if mode == "write":
    t.store(7, hang, keep_evicted=False)
else:
    with t._locked():
        marker.write_text("x")
        time.sleep(60)
"""


def _kill_child_at(seg: Path, tmp: Path, mode: str) -> None:
    marker = tmp / f"marker-{mode}"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(seg), str(marker), mode], env=env)
    try:
        deadline = time.monotonic() + 30
        while not marker.exists():
            assert child.poll() is None and time.monotonic() < deadline, "child did not start"
            time.sleep(0.01)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)


@pytest.mark.parametrize("mode", ["write", "lock"])
def test_a_worker_killed_mid_write_or_holding_the_lock_leaves_the_tier_consistent(
    seg: Path, tmp_path: Path, mode: str
) -> None:
    tier = SharedHostTier(seg, 2, NB, LAYOUT)
    tier.store(1, fill(1), keep_evicted=False)
    _kill_child_at(seg, tmp_path, mode)
    tier.check_integrity()  # the dead child's lock is gone
    assert 7 not in tier and read(tier, 7) is None  # a half-written block is never read
    assert int((tier._table["state"] == WRITING).sum()) == (1 if mode == "write" else 0)
    assert tier.store(2, fill(2), keep_evicted=False)[0]
    assert tier.store(3, fill(3), keep_evicted=False)[0]  # takes the dead writer's slot or LRU
    assert read(tier, 2) == b"\x02" * NB and read(tier, 3) == b"\x03" * NB
    tier.check_integrity()
    tier.close()
