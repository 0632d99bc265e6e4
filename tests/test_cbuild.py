"""``interlock.cbuild``: a C file built once per source and flags, reused, refused clearly."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from interlock import cbuild
from interlock.env import get_env

FLAGS = ("-O2", "-shared", "-fPIC")


def test_built_once_then_reused_and_rebuilt_when_the_source_changes(
    cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "add.c"
    source.write_text("long add(long a, long b) { return a + b; }\n")
    library = cbuild.build(source, FLAGS, "add")
    assert library.is_relative_to(cache_dir) and library.name == "libadd.so"
    assert ctypes.CDLL(str(library)).add(2, 3) == 5
    monkeypatch.setenv("PATH", "")  # no compiler: the cached library is enough
    assert cbuild.build(source, FLAGS, "add") == library
    source.write_text("long add(long a, long b) { return a + b + 1; }\n")
    with pytest.raises(RuntimeError, match="no C compiler"):
        cbuild.build(source, FLAGS, "add")  # a new source is never served the old library


def test_a_failed_build_says_what_the_compiler_said(cache_dir: Path, tmp_path: Path) -> None:
    source = tmp_path / "bad.c"
    source.write_text("int broken( {\n")
    with pytest.raises(RuntimeError, match="failed: .*error"):
        cbuild.build(source, FLAGS, "bad")
    assert not list(cbuild.build_dir(source, FLAGS, "bad").glob("*.so"))


def test_switched_off_by_interlock_cpu_kernels(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert cbuild.enabled()
    monkeypatch.setenv("INTERLOCK_CPU_KERNELS", "0")
    get_env.cache_clear()
    assert not cbuild.enabled()
