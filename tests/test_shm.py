"""Shared-memory segments left by killed processes: a child's process group killed after the
child dies takes its grandchildren's ``psm_`` segments with it, unless a live process still maps
one (then it stays)."""

from __future__ import annotations

import asyncio
import sys
from multiprocessing import shared_memory
from pathlib import Path

import pytest

from interlock import shm
from interlock.cluster.procs import Child

pytestmark = pytest.mark.skipif(not shm.SHM_DIR.is_dir(), reason="no /dev/shm")

# The child starts a grandchild in its own process group that makes a segment (not tracked by
# multiprocessing's resource tracker, as vLLM's are not) and sleeps; the child prints the
# segment's name and the grandchild's pid into the file named by its argument, then waits.
SCRIPT = r"""
import subprocess, sys
grandchild = subprocess.Popen([sys.executable, "-c", '''
import sys, time
from multiprocessing import resource_tracker, shared_memory
seg = shared_memory.SharedMemory(create=True, size=1 << 20)
resource_tracker.unregister(seg._name, "shared_memory")
print(seg.name, flush=True)
time.sleep(60)
'''], stdout=subprocess.PIPE, text=True)
line = f"{grandchild.stdout.readline().strip()} {grandchild.pid}"
open(sys.argv[1] + ".tmp", "w").write(line)
import os; os.rename(sys.argv[1] + ".tmp", sys.argv[1])
import time; time.sleep(60)
"""


async def _start(tmp_path: Path) -> tuple[Child, str, int]:
    """The child started; the segment's name and the grandchild's pid."""
    out = tmp_path / "segment"
    child = Child("segments", [sys.executable, "-c", SCRIPT, str(out)], relay=False)
    await child.start()
    for _ in range(600):
        if out.exists():
            name, pid = out.read_text().split()
            return child, name, int(pid)
        await asyncio.sleep(0.1)
    raise AssertionError("the child did not report its segment in 60 s")


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]


def test_a_dead_childs_group_takes_its_segments_with_it(tmp_path: Path) -> None:
    async def run() -> None:
        child, name, grandchild = await _start(tmp_path)
        assert (shm.SHM_DIR / name).exists()
        assert shm.mapped_by(shm.group_members(child.pid or 0)) == {name}
        assert name in shm.mapped_by(shm.descendants(child.pid or 0))
        assert child.process is not None
        child.process.kill()
        await child.wait()
        assert not (shm.SHM_DIR / name).exists()
        assert not _alive(grandchild) or not shm.mapped_by([grandchild])

    asyncio.run(run())


def test_a_segment_another_process_maps_is_kept(tmp_path: Path) -> None:
    async def run() -> None:
        child, name, _ = await _start(tmp_path)
        mine = shared_memory.SharedMemory(name=name)  # this process maps it too
        try:
            assert child.process is not None
            child.process.kill()
            await child.wait()
            assert (shm.SHM_DIR / name).exists()
            assert shm.release([name]) == []  # still mapped here
        finally:
            mine.close()
        assert shm.release([name]) == [name]
        assert not (shm.SHM_DIR / name).exists()

    asyncio.run(run())


def test_release_touches_no_name_but_psm() -> None:
    other = shm.SHM_DIR / "interlock-test-not-psm"
    other.write_bytes(b"x")
    try:
        assert shm.release([other.name, "psm_../../etc/passwd"]) == []
        assert other.exists()
    finally:
        other.unlink()


def test_segments_made_since_a_moment_are_found_mapped_or_not() -> None:
    import time

    before, t0 = shm.listing(), time.time()
    seg = shared_memory.SharedMemory(create=True, size=4096)
    try:
        assert seg.name in shm.created_since(before, t0)
        assert seg.name not in shm.created_since(before | {seg.name}, t0)
        assert seg.name in shm.listing()
    finally:
        seg.close()
        seg.unlink()
