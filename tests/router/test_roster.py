"""The roster answers as going over every known worker would (what the router service did per
join before), in the same order, after any sequence of routes, holds and departures."""

from __future__ import annotations

import random

import pytest

from interlock.protocol import InstanceInfo, subjects
from interlock.router.model_card import Card, card_of, majority_card
from interlock.router.roster import Roster

CARDS = (Card("p", 2048), Card("p", 4096), Card("q", 2048))
MODELS = ("m", "n")
ROLES = ("both", "decode", "prefill")


def info(wid: str, model: str = "m", card: Card = CARDS[0], role: str = "both") -> InstanceInfo:
    return InstanceInfo(
        instance_id=wid,
        endpoint=subjects.GENERATE_ENDPOINT,
        model=model,
        model_path=card.model_path,
        context_length=card.context_length,
        role=role,
        address=f"inproc://{wid}",
    )


class Reference:
    """What the service did: two dicts, and a walk over both for every question."""

    def __init__(self) -> None:
        self.routed: dict[str, InstanceInfo] = {}
        self.held: dict[str, InstanceInfo] = {}

    def members(self, model: str) -> list[InstanceInfo]:
        return [
            i
            for i in (*self.routed.values(), *self.held.values())
            if i.model == model and i.role != "prefill"
        ]

    def majority(self, model: str, current: Card | None) -> Card | None:
        live = self.members(model)
        return majority_card([card_of(i) for i in live], current) if live else None

    def card_with(self, info: InstanceInfo, current: Card | None) -> Card:
        others = [card_of(i) for i in self.members(info.model) if i.instance_id != info.instance_id]
        return majority_card([*others, card_of(info)], current)

    def routed_off(self, model: str, card: Card) -> list[InstanceInfo]:
        return [i for i in self.members(model) if i.instance_id in self.routed and card_of(i) != card]

    def held_on(self, model: str, card: Card) -> list[InstanceInfo]:
        return [i for i in self.members(model) if i.instance_id in self.held and card_of(i) == card]


def _random_info(rng: random.Random) -> InstanceInfo:
    return info(f"w{rng.randrange(12)}", rng.choice(MODELS), rng.choice(CARDS), rng.choice(ROLES))


def _agree(roster: Roster, ref: Reference, rng: random.Random) -> None:
    roster.check_integrity()
    assert dict(roster.routed) == ref.routed and list(roster.routed) == list(ref.routed)
    assert dict(roster.held) == ref.held and list(roster.held) == list(ref.held)
    for model in (*MODELS, "absent"):
        assert roster.serving(model) == sum(i.model == model for i in ref.routed.values())
        for current in (None, *CARDS):
            assert roster.majority(model, current) == ref.majority(model, current)
        for card in CARDS:
            assert roster.routed_off(model, card) == ref.routed_off(model, card)
            assert roster.held_on(model, card) == ref.held_on(model, card)
    probe = _random_info(rng)
    current = rng.choice((None, *CARDS))
    assert roster.card_with(probe, current) == ref.card_with(probe, current)


@pytest.mark.parametrize("seed", range(20))
def test_the_roster_answers_as_a_walk_over_every_worker_would(seed: int) -> None:
    rng = random.Random(seed)
    roster, ref = Roster(), Reference()
    for _ in range(300):
        new = _random_info(rng)
        wid = new.instance_id
        op = rng.randrange(4)
        if op == 0 and wid not in ref.held:  # a (re)registration routed: replaced in place
            roster.route(new)
            ref.routed[wid] = new
        elif op == 1 and wid not in ref.routed and wid not in ref.held:
            roster.hold(new)
            ref.held[wid] = new
        elif op == 2:
            assert roster.unroute(wid) == ref.routed.pop(wid, None)
        elif op == 3:
            assert roster.unhold(wid) == ref.held.pop(wid, None)
        _agree(roster, ref, rng)


def test_a_worker_is_routed_or_held_never_both() -> None:
    roster = Roster()
    roster.route(info("a"))
    with pytest.raises(AssertionError):
        roster.hold(info("a"))
    roster.unroute("a")
    roster.hold(info("a"))
    with pytest.raises(AssertionError):
        roster.route(info("a"))
