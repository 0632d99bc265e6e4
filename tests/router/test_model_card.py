"""The model card by majority: ties keep the current card, then the smallest context."""

from __future__ import annotations

import pytest

from interlock.router.model_card import Card, majority_card

A, B, C = Card("p", 2048), Card("p", 1), Card("q", 2048)


def test_the_most_common_card_wins_whatever_the_current() -> None:
    assert majority_card([A, A, B], current=B) == A
    assert majority_card([B, B, A], current=A) == B


def test_a_tie_keeps_the_current_card_then_takes_the_smallest_context() -> None:
    assert majority_card([A, B], current=A) == A
    assert majority_card([A, B], current=None) == B
    assert majority_card([A, C], current=Card("z", 9)) == A  # same context: by path


def test_no_cards_is_an_error() -> None:
    with pytest.raises(ValueError):
        majority_card([], current=A)
