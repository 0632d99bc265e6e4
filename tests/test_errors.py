"""The one error <-> wire mapping: each error class has a code of its own, and ``rebuild`` gives
back the class with its ``param`` whatever its constructor takes."""

from __future__ import annotations

import pytest

from interlock import errors
from interlock.errors import EngineError, InterlockError, NoWorkers, PromptTooLong, RateLimited, rebuild


def _all(cls: type[InterlockError]) -> list[type[InterlockError]]:
    """``cls`` and its subclasses, each once (``Retryable`` ones have two bases)."""
    return list(dict.fromkeys([cls, *(c for sub in cls.__subclasses__() for c in _all(sub))]))


def test_every_error_class_has_a_code_of_its_own() -> None:
    classes = _all(InterlockError)[1:]
    codes = [c.code for c in classes]
    assert len(codes) == len(set(codes)), sorted(codes)
    assert PromptTooLong.code == "prompt_too_long" and NoWorkers.code == "no_workers"


@pytest.mark.parametrize("cls", [c for c in _all(InterlockError)[1:] if c.__module__ == errors.__name__])
def test_rebuild_gives_the_class_and_its_param_back(cls: type[InterlockError]) -> None:
    err = rebuild(cls.code, "why", "field", unknown=EngineError)
    assert type(err) is cls and err.message == "why" and err.param == "field"


def test_an_unknown_code_is_the_fallback_class() -> None:
    err = rebuild("from_a_newer_peer", "why", None, unknown=EngineError)
    assert type(err) is EngineError and err.message == "why"
    assert type(rebuild(RateLimited.code, "slow down", None, unknown=EngineError)) is RateLimited
