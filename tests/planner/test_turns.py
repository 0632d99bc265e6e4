from __future__ import annotations

import pytest

from interlock.planner.turns import MEMORY_S, TurnMemory


def test_a_growth_soon_after_a_removal_refutes_the_size_it_left() -> None:
    m = TurnMemory(turn_s=120.0)
    m.observe(0.0, {"both": 10}, {"both": 5.0})
    m.observe(5.0, {"both": 9}, {"both": 5.0})  # a removal: 9 workers for a need of 5
    assert m.floor("both") == 0.0 and m.fewest("both", 5.0) == 0
    m.observe(90.0, {"both": 10}, {"both": 5.0})  # grown back at the same load
    assert m.floor("both") == pytest.approx(9 / 5)
    assert m.fewest("both", 5.0) == 11  # 9 refuted, with 20% to spare
    assert m.fewest("both", 2.5) == 6  # a ratio: half the load, half the floor
    m.observe(MEMORY_S + 95.0, {"both": 10}, {"both": 5.0})
    assert m.fewest("both", 5.0) == 0  # forgotten: the size may be tried again


def test_growth_for_a_rising_load_or_long_after_refutes_nothing() -> None:
    rise = TurnMemory(turn_s=120.0)
    rise.observe(0.0, {"both": 4}, {"both": 2.0})
    rise.observe(5.0, {"both": 3}, {"both": 2.0})
    rise.observe(60.0, {"both": 5}, {"both": 6.0})  # the load tripled: growth answers the load
    assert rise.floor("both") == 0.0
    late = TurnMemory(turn_s=120.0)
    late.observe(0.0, {"both": 4}, {"both": 2.0})
    late.observe(5.0, {"both": 3}, {"both": 2.0})
    late.observe(200.0, {"both": 4}, {"both": 2.0})  # after turn_s
    assert late.floor("both") == 0.0
    assert late.fewest("decode", 3.0) == 0
