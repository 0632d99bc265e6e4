"""Fixtures every test package may use."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from interlock.env import get_env

# Under xdist (`scripts/test.sh` runs `-n 2`), the end-to-end files run in two groups, each one
# test at a time in one worker, before the rest, which goes module by module to whichever worker
# is free: the multi-host tests share one netns subnet, and two served fleets at once already fill
# two cores (more beside them starve the heartbeats that the tests' short leases wait on).
_SERIAL_GROUPS = (("tests/e2e/test_vllm", "vllm"), ("tests/e2e/", "e2e"))


def _serial_group(nodeid: str) -> str | None:
    return next((g for prefix, g in _SERIAL_GROUPS if nodeid.startswith(prefix)), None)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The long groups first, so that each worker starts on one and the short tests fill in after.
    order = {name: i for i, (_, name) in enumerate(_SERIAL_GROUPS)}
    items.sort(key=lambda item: order.get(_serial_group(item.nodeid) or "", len(order)))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """xdist's scheduling by module, with each serial group one unit of work, in collection order."""
    from xdist.scheduler import LoadScopeScheduling

    class Scheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return _serial_group(nodeid) or super()._split_scope(nodeid)

    config.option.loadscopereorder = False
    return Scheduling(config, log)


@pytest.fixture
def cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """An empty ``INTERLOCK_CACHE_DIR`` of the test's own (no converted model in it)."""
    monkeypatch.setenv("INTERLOCK_CACHE_DIR", str(tmp_path / "cache"))
    get_env.cache_clear()
    yield tmp_path / "cache"
    monkeypatch.undo()
    get_env.cache_clear()
