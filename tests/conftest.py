"""Fixtures every test package may use."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from interlock.env import get_env


@pytest.fixture
def cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """An empty ``INTERLOCK_CACHE_DIR`` of the test's own (no converted model in it)."""
    monkeypatch.setenv("INTERLOCK_CACHE_DIR", str(tmp_path / "cache"))
    get_env.cache_clear()
    yield tmp_path / "cache"
    monkeypatch.undo()
    get_env.cache_clear()
