"""A model's card (its tokenizer folder and context length) as its live workers say it, by majority.

Every worker announces the card it serves with. Taking the smallest context length among them
let any one worker shrink the model for every client: a worker re-announcing itself with
``context_length=1`` made every request a 400. So the card is the one most live workers
announce; a tie keeps the card the model already has (then the smallest context, the safe
side, for a model seen for the first time). A worker whose card differs waits aside, out of
routing, until the majority agrees with it (a rolling upgrade: once most workers run the new
card it becomes the model's, and the old ones wait aside in turn) — so a worker can change
what it serves only for itself, never the model's card for others.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from interlock.protocol import InstanceInfo


class Card(NamedTuple):
    model_path: str
    context_length: int


def card_of(info: InstanceInfo) -> Card:
    """The card a worker announces."""
    return Card(info.model_path, info.context_length)


def majority_card(cards: Iterable[Card], current: Card | None) -> Card:
    """The card most of ``cards`` carry; ties go to ``current``, then to the smallest context."""
    return majority_of(Counter(cards), current)


def majority_of(counts: Mapping[Card, int], current: Card | None) -> Card:
    """``majority_card`` of cards already counted (a count of 0 is no card)."""
    top = max(counts.values(), default=0)
    if top <= 0:
        raise ValueError("no cards")
    tied = [card for card, n in counts.items() if n == top]
    if current in tied:
        assert current is not None
        return current
    return min(tied, key=lambda card: (card.context_length, card.model_path))
