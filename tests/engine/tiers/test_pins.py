"""Pins: a slot stays pinned until its last read is over."""

from __future__ import annotations

import pytest

from interlock.engine.tiers.pins import Pins


def test_a_slot_is_pinned_while_any_read_holds_it() -> None:
    pins = Pins()
    pins.pin(3)
    pins.pin(3)
    pins.pin(5)
    assert (3 in pins, len(pins), sorted(pins)) == (True, 2, [3, 5])
    pins.unpin(3)
    assert 3 in pins
    pins.unpin(3)
    assert 3 not in pins and len(pins) == 1
    with pytest.raises(KeyError):
        pins.unpin(3)  # released more often than pinned: the caller's bug, loud
