"""Who the router service knows: the workers it routes to and those it holds aside.

A model's card is the one most of its live workers announce, and a worker whose card differs is
held out of routing until most agree with it (``model_card``). Deciding that by going over
every known worker made each join cost O(N) and a fleet's joins quadratic (2,000 workers took
seconds, 10,000 minutes). Here each worker that takes requests (a *member*: any role but
prefill only) is filed under its model, its card and whether it is routed, and each model keeps
a count per card; a join, a leave, the majority and the workers a new majority moves all cost
O(1) plus the model's distinct cards (one in a steady fleet, two during a rolling upgrade) and
the workers that actually move.

Invariants (``check_integrity``): a worker is routed or held, never both; each member is filed
once, under its model, card and standing, with its place in ``routed``'s or ``held``'s order;
each model's card counts are its members' cards; ``serving`` counts a model's routed workers,
every role.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping
from types import MappingProxyType
from typing import TypeVar

from interlock.protocol import InstanceInfo
from interlock.router.model_card import Card, card_of, majority_of

_File = tuple[str, Card, bool]
"""(model, card, routed): where a member is filed."""
_K = TypeVar("_K")


class Roster:
    def __init__(self) -> None:
        self._routed: dict[str, InstanceInfo] = {}
        self._held: dict[str, InstanceInfo] = {}
        self.routed: Mapping[str, InstanceInfo] = MappingProxyType(self._routed)
        """Routed workers by id (read only: ``route``, ``unroute``)."""
        self.held: Mapping[str, InstanceInfo] = MappingProxyType(self._held)
        """Workers held out of routing by id, in the order they were held (``hold``, ``unhold``)."""
        self._serving: Counter[str] = Counter()
        self._prefill: Counter[str] = Counter()
        """Routed prefill workers by model."""
        self._votes: dict[str, Counter[Card]] = {}
        self._files: dict[_File, dict[str, int]] = {}
        """Member id -> its place (``_place``) in ``routed`` or ``held`` order."""
        self._place: dict[str, int] = {}
        self._next_place = itertools.count()

    # ---- changes ----
    def route(self, info: InstanceInfo) -> None:
        """Route ``info``, replacing the routed registration of its id (which keeps its place)."""
        wid = info.instance_id
        assert wid not in self._held, f"{wid} is held"
        old = self._routed.get(wid)
        if old is None:
            self._place[wid] = next(self._next_place)
        else:
            self._unfile(old, routed=True)
        self._routed[wid] = info
        self._file(info, routed=True)

    def unroute(self, instance_id: str) -> InstanceInfo | None:
        info = self._routed.pop(instance_id, None)
        if info is not None:
            self._unfile(info, routed=True)
            del self._place[instance_id]
        return info

    def hold(self, info: InstanceInfo) -> None:
        wid = info.instance_id
        assert wid not in self._routed and wid not in self._held, f"{wid} is known"
        self._place[wid] = next(self._next_place)
        self._held[wid] = info
        self._file(info, routed=False)

    def unhold(self, instance_id: str) -> InstanceInfo | None:
        info = self._held.pop(instance_id, None)
        if info is not None:
            self._unfile(info, routed=False)
            del self._place[instance_id]
        return info

    # ---- questions ----
    def serving(self, model: str) -> int:
        """How many workers of ``model`` are routed (every role)."""
        return self._serving[model]

    def prefill(self, model: str) -> int:
        """Routed prefill workers of ``model``."""
        return self._prefill[model]

    def majority(self, model: str, current: Card | None) -> Card | None:
        """The card most of the model's members announce (``majority_card``); None: no member."""
        votes = self._votes.get(model)
        return majority_of(votes, current) if votes else None

    def card_with(self, info: InstanceInfo, current: Card | None) -> Card:
        """The model's card were ``info`` one of its members (in place of what its id is now)."""
        votes = Counter(self._votes.get(info.model, {}))
        now = self._routed.get(info.instance_id) or self._held.get(info.instance_id)
        if now is not None and _is_member(now) and now.model == info.model:
            votes[card_of(now)] -= 1
        votes[card_of(info)] += 1
        return majority_of(votes, current)

    def routed_off(self, model: str, card: Card) -> list[InstanceInfo]:
        """The model's routed members whose card is not ``card``, in ``routed`` order."""
        ids = [
            wid
            for other in self._votes.get(model, {})
            if other != card
            for wid in self._files.get((model, other, True), {})
        ]
        return [self._routed[wid] for wid in sorted(ids, key=self._place.__getitem__)]

    def held_on(self, model: str, card: Card) -> list[InstanceInfo]:
        """The model's held members whose card is ``card``, in the order they were held."""
        ids = self._files.get((model, card, False), {})
        return [self._held[wid] for wid in sorted(ids, key=self._place.__getitem__)]

    def check_integrity(self) -> None:
        """Assert the invariants of the module note (O(N): for tests)."""
        assert not self._routed.keys() & self._held.keys()
        assert self._place.keys() == self._routed.keys() | self._held.keys()
        assert list(self._routed) == sorted(self._routed, key=self._place.__getitem__)
        assert list(self._held) == sorted(self._held, key=self._place.__getitem__)
        files: dict[_File, dict[str, int]] = {}
        votes: dict[str, Counter[Card]] = {}
        for routed, infos in ((True, self._routed), (False, self._held)):
            for wid, info in infos.items():
                if _is_member(info):
                    files.setdefault((info.model, card_of(info), routed), {})[wid] = self._place[wid]
                    votes.setdefault(info.model, Counter())[card_of(info)] += 1
        assert files == self._files, "members filed wrong"
        assert votes == self._votes, "card counts wrong"
        assert self._serving == Counter(info.model for info in self._routed.values())
        assert self._prefill == Counter(i.model for i in self._routed.values() if i.role == "prefill")

    # ---- internals ----
    def _file(self, info: InstanceInfo, *, routed: bool) -> None:
        if routed:
            self._serving[info.model] += 1
            if info.role == "prefill":
                self._prefill[info.model] += 1
        if not _is_member(info):
            return
        card = card_of(info)
        self._votes.setdefault(info.model, Counter())[card] += 1
        self._files.setdefault((info.model, card, routed), {})[info.instance_id] = self._place[
            info.instance_id
        ]

    def _unfile(self, info: InstanceInfo, *, routed: bool) -> None:
        if routed:
            _decrement(self._serving, info.model)
            if info.role == "prefill":
                _decrement(self._prefill, info.model)
        if not _is_member(info):
            return
        card = card_of(info)
        votes = self._votes[info.model]
        _decrement(votes, card)
        if not votes:
            del self._votes[info.model]
        key = (info.model, card, routed)
        members = self._files[key]
        del members[info.instance_id]
        if not members:
            del self._files[key]


def _is_member(info: InstanceInfo) -> bool:
    """Takes requests, so it counts for the model's card (a prefill-only worker does not)."""
    return info.role != "prefill"


def _decrement(counts: Counter[_K], key: _K) -> None:
    counts[key] -= 1
    if not counts[key]:
        del counts[key]
