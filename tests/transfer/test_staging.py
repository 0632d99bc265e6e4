import os
import subprocess
import sys
import time

import pytest

from interlock.transfer import staging as stg


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_shared_buffer_round_trip_through_header():
    src = stg.Staging.create(5000, shared=True)
    try:
        assert src.shared and src.name in stg.list_segments(os.getpid())
        gen = src.prepare(4999)
        src.payload[:] = bytes(range(256)) * 19 + bytes(135)
        dst = stg.Staging.attach(src.name)
        assert bytes(dst.view_of(4999, gen)) == bytes(src.payload)
        dst.set_word(stg.W_DEST_STATE, stg.DEST_DONE)
        assert src.word(stg.W_DEST_STATE) == stg.DEST_DONE
        assert src.word(stg.W_SRC_PID) == os.getpid()
        gen2 = src.prepare(10)  # reuse: a new generation, destination state reset
        assert gen2 != gen and src.word(stg.W_DEST_STATE) == stg.DEST_NONE
        assert isinstance(dst.view_of(4999, gen), str)  # the old use is gone
        assert len(dst.view_of(10, gen2)) == 10
        dst.release(unlink=False)
    finally:
        src.release()
    assert src.name not in stg.list_segments()
    src.release()  # idempotent


def test_attach_rejects_foreign_names_and_missing_files():
    src = stg.Staging.create(10, shared=True)
    src.release()
    with pytest.raises(ValueError):
        stg.Staging.attach("../etc/passwd")
    with pytest.raises(FileNotFoundError):
        stg.Staging.attach(src.name)


def test_private_buffer_when_not_shared():
    st = stg.Staging.create(0, shared=False)
    st.prepare(0)
    assert not st.shared and len(st.payload) == 0
    st.release()


def test_sweep_removes_only_dead_creators():
    dead = _dead_pid()
    orphan = stg.SHM_DIR / f"{stg.PREFIX}{dead}-deadbeef"
    orphan.write_bytes(b"x")
    mine = stg.Staging.create(1, shared=True)
    try:
        assert stg.sweep_orphans() >= 1
        assert not orphan.exists()
        assert mine.name in stg.list_segments(os.getpid())
    finally:
        mine.release()


def test_pid_alive_treats_zombies_as_dead():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    for _ in range(500):
        with open(f"/proc/{proc.pid}/stat") as f:
            if f.read().rpartition(")")[2].split()[0] == "Z":
                break
        time.sleep(0.01)
    assert not stg.pid_alive(proc.pid)  # exited, not yet reaped
    proc.wait()
    assert stg.pid_alive(os.getpid())
    assert not stg.pid_alive(0)
