"""Mapped peer caches (``SharedViews``): one mapping per source, checked against the region each
time, forgotten when the source dies while a copy holding it keeps it readable."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import msgspec
import numpy as np
import pytest

from interlock.engine.shared_cache import SharedViews, copy_parts, layout_mismatch, part_range
from interlock.protocol.transfer import SharedCacheRegion

_CHILD = textwrap.dedent(
    """
    import os, sys, mmap
    fd = os.memfd_create("kv-test")
    os.ftruncate(fd, 4096)
    m = mmap.mmap(fd, 4096, mmap.MAP_SHARED)
    m[:] = bytes(range(256)) * 16
    print(os.getpid(), fd, os.fstat(fd).st_ino, flush=True)
    sys.stdin.readline()
    """
)


def test_views_are_kept_per_source_and_dropped_when_it_dies() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        pid, fd, ino = map(int, proc.stdout.readline().split())
        region = SharedCacheRegion(pid=pid, fd=fd, ino=ino, num_blocks=4, piece=1024, pieces=1, dtype="u8")
        views = SharedViews()
        view = views.get(region)
        assert views.get(region) is view and len(views) == 1 and views.prune() == 0
        with pytest.raises(ValueError, match="is another file"):
            views.get(msgspec.structs.replace(region, ino=ino + 1))
        proc.kill()
        proc.wait(timeout=10)
        assert views.prune() == 1 and len(views) == 0
        assert np.array_equal(view.array[:256], np.arange(256, dtype=np.uint8))  # still mapped
        with pytest.raises(OSError):  # and nothing to map any more
            views.get(region)
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_layouts_must_match_in_piece_pieces_and_dtype() -> None:
    region = SharedCacheRegion(pid=1, fd=3, ino=7, num_blocks=4, piece=1024, pieces=2, dtype="bfloat16")
    assert layout_mismatch(region, 1024, 2, "bfloat16") == ""
    for mine in ((2048, 2, "bfloat16"), (1024, 1, "bfloat16"), (1024, 2, "float16")):
        assert "shared cache layout" in layout_mismatch(region, *mine)


@pytest.mark.parametrize("length", [1, 4, 180])
@pytest.mark.parametrize("parts", [1, 2, 7, 9, 200])
def test_parts_cover_the_pieces_once_in_order(length: int, parts: int) -> None:
    ranges = [part_range((k, parts), length) for k in range(parts)]
    assert ranges[0][0] == 0 and ranges[-1][1] == length
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))  # no gap, no overlap
    sizes = [stop - start for start, stop in ranges]
    assert max(sizes) - min(sizes) <= 1  # as equal as whole pieces allow


def test_a_part_that_does_not_exist_is_refused_by_name() -> None:
    for part in ((3, 3), (-1, 3), (0, 0)):
        with pytest.raises(ValueError, match=f"part {part[0]} of {part[1]} does not exist"):
            part_range(part, 10)


def test_copy_parts_is_the_steps_of_about_the_step_size() -> None:
    assert copy_parts(64 << 20, 8 << 20) == 8
    assert copy_parts((64 << 20) + 1, 8 << 20) == 9
    assert copy_parts(100, 8 << 20) == 1
    assert copy_parts(0, 8 << 20) == 1  # one (empty) part: the hold check still runs
    assert copy_parts(100, 0) == 100  # a step size of nothing: a byte a part
