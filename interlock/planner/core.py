"""The planner's decision core: observation in, at most one action out, with its reason.

Idea: change the fleet in small steps and look before the next one. A new worker arrives with
an empty cache and needs time to warm up, and a removed one takes its cache with it, so acting
on every fluctuation costs more than it saves. Each call:

1. asks the policy (reactive or SLA) what each pool wants: grow, or may shrink;
2. decides nothing while a worker is still starting, or within ``window_s`` of the last change
   (an add right after an add: ``grow_window_s``; a removal right after a removal:
   ``shrink_window_s``); adds stop once ``PlannerConfig.change_cap`` workers were added (or
   switched) in the last ``cap_window_s``, removals once as many were removed (or switched):
   each direction has its own count, so a burst of adds for a surge does not then hold the
   surge's fleet, idle, for the rest of the cap window (a 60 s spike's 12 adds held 13 workers
   for five minutes where 4 served); flapping is held by the windows (turning round waits a
   whole ``window_s``) and by each direction's cap;
3. puts a pool outside its bounds back in (one worker);
4. turns a grow of one disaggregated pool plus a shrink of the other into one role switch
   (the fleet keeps its size, the roles follow the mix);
5. else grows the most pressed pool that may grow (within its max and ``max_workers``),
   else shrinks one that may shrink (never below ``min_workers`` in all), removing the workers
   whose loss costs least (``planner.select``).

A step is one worker, or up to ``step_share`` of the pool when the policy asks for several
(``Want.delta``), within the bounds and the change cap (each worker one change): one worker
per window is a large step for a small fleet and too slow a one for a large fleet's day.

One exception to one step per window: a *surge* (``Want.surge``: the SLA policy when arrivals
jump far above what the pool was sized for). Adding one step per window after a jump in the
load leaves the fleet short for minutes, and the queue built then takes minutes more to
drain; so a surge is served before step 2's holds (a worker still starting, the window) with
as many workers as it asks for, within the pool's max, ``max_workers`` and the change cap.
The policy counts starting workers in the pool, so it does not ask twice for the same surge.

Two more exceptions, for a pool whose ``min`` is 0 (scale to zero): requests waiting at an
empty fleet start a worker at once, past every hold; a pool with nothing to do for
``zero_after_s`` stops its last workers. A policy's shrink alone never empties a pool.

Hosts: every add is capped by ``Observation.room`` (what the hosts can still place,
``planner.placement``); a pool that should grow but has no room holds and says why.

No I/O and no clock of its own: time is ``Observation.now``. Connectors apply the action and
report the result in the next observation (a starting worker, a draining one).
"""

from __future__ import annotations

import math
from collections import deque

from interlock.planner.config import PlannerConfig
from interlock.planner.policy import Policy, Want
from interlock.planner.select import cheapest, cheapest_first
from interlock.planner.state import (
    Action,
    AddWorker,
    DecisionRecord,
    Observation,
    RemoveWorker,
    SwitchRole,
    WorkerView,
)
from interlock.protocol.discovery import ROLES

SWITCHABLE = ("prefill", "decode")


class Planner:
    def __init__(self, config: PlannerConfig, policy: Policy) -> None:
        self.config = config
        self.policy = policy
        self.last_change = -float("inf")
        self._last: type[Action] | None = None
        """The kind of the last change (None: none yet)."""
        self._changes: deque[tuple[float, int]] = deque()
        """(when, direction) of the changes in the cap window: +1 an add, -1 a removal, 0 a
        switch (it counts in both directions)."""
        self.history: list[DecisionRecord] = []
        self.last_wants: list[Want] = []
        self.last_hold = ""
        """Why the last call decided nothing ("" after an action)."""
        self._busy_at: dict[str, float] = {}
        """role -> when it last had something to do (scale to zero)."""

    def decide(self, obs: Observation) -> list[Action]:
        pools = {r: obs.pool(r) for r in ROLES if self.config.bounds(r).max or obs.pool(r)}
        self.last_wants = self.policy.wants(obs, pools)
        self._note_busy(obs, pools)
        urgent = self._wake(obs, pools) or self._surge(obs, pools, self.last_wants)
        if urgent:
            self.last_hold = ""
            return urgent
        hold = self._hold(obs)
        if hold:
            self.last_hold = hold
            return []
        bound = self._bounds(pools, obs)
        actions = [bound] if bound is not None else self._idle(obs, pools) or self._act(pools, obs)
        if not actions:
            self.last_hold = self._no_room(obs) or self._cap_reason() or "nothing to do"
            return []
        since = obs.now - self.last_change
        if since < self.config.window_s and not isinstance(actions[0], self._last or ()):
            self.last_hold = self._observing(since)
            return []
        self.last_hold = ""
        return self._record(obs.now, actions)

    def _record(self, now: float, actions: list[Action]) -> list[Action]:
        self.last_change = now
        self._last = type(actions[-1])
        for a in actions:
            self._changes.append(
                (now, +1 if isinstance(a, AddWorker) else -1 if isinstance(a, RemoveWorker) else 0)
            )
            self.history.append(DecisionRecord(now, a))
        return actions

    # ---- gates ----
    def holding(self, now: float) -> bool:
        """True when the window or the change cap rules out any action at ``now`` (a connector
        may then skip observing what only matters to an action, like cache ownership)."""
        self._trim(now)
        return now - self.last_change < self._gap() or (self._cap_room(+1) <= 0 and self._cap_room(-1) <= 0)

    def _gap(self) -> float:
        """The least time after the last change before the next one may come."""
        if self._last is AddWorker:
            return self.config.add_window_s()
        if self._last is RemoveWorker:
            return self.config.remove_window_s()
        return self.config.window_s

    def _observing(self, since: float) -> str:
        return f"observing: {since:.0f}s of the {self.config.window_s:g}s window since the last change"

    def _hold(self, obs: Observation) -> str:
        starting = [w.worker_id for w in obs.workers if not w.ready and not w.draining]
        if starting:
            return f"waiting for {', '.join(starting)} to start"
        if obs.now - self.last_change < self._gap():
            return self._observing(obs.now - self.last_change)
        self._trim(obs.now)
        if self._cap_room(+1) <= 0 and self._cap_room(-1) <= 0:
            return self._capped(+1)
        return ""

    def _trim(self, now: float) -> None:
        """Forget the changes older than ``cap_window_s``."""
        while self._changes and self._changes[0][0] <= now - self.config.cap_window_s:
            self._changes.popleft()

    def _cap_reason(self) -> str:
        """The hold when a pool asks to move in a direction whose cap is spent ("" otherwise)."""
        for direction in (+1, -1):
            if self._cap_room(direction) <= 0 and any(w.delta * direction > 0 for w in self.last_wants):
                return self._capped(direction)
        return ""

    def _capped(self, direction: int) -> str:
        c = self.config
        what = "added" if direction > 0 else "removed"
        used = c.change_cap() - self._cap_room(direction)
        return f"{used} workers {what} or switched in the last {c.cap_window_s:g}s (cap {c.change_cap()})"

    # ---- choices ----
    def _room(self, obs: Observation) -> int:
        """Workers the hosts can still place (a large number when no limit is known)."""
        return (1 << 30) if obs.room is None else max(obs.room, 0)

    def _no_room(self, obs: Observation) -> str:
        """The hold when a pool asks to grow and the hosts have no room ("" otherwise)."""
        grows = [w for w in self.last_wants if w.delta > 0]
        if not grows or self._room(obs) > 0:
            return ""
        return f"cannot grow ({grows[0].reason}): no room on the hosts: {obs.room_reason or 'full'}"

    def _wake(self, obs: Observation, pools: dict[str, list[WorkerView]]) -> list[Action]:
        """A worker at once for requests waiting at an empty fleet (scale to zero)."""
        if obs.router_queue <= 0 or any(pools.values()) or self._room(obs) < 1:
            return []
        role = next((r for r in ("both", "decode", "prefill") if self.config.bounds(r).max), None)
        if role is None:
            return []
        why = f"{obs.router_queue} requests wait and no {role} worker runs: starting one"
        return self._record(obs.now, [AddWorker(role, why)])

    def _note_busy(self, obs: Observation, pools: dict[str, list[WorkerView]]) -> None:
        """When each pool last had something to do: at every observation, holds or not (work
        seen during a window's hold keeps a pool from scaling to zero just after it)."""
        busy = obs.router_queue > 0 or obs.traffic.requests > 0
        for role, workers in pools.items():
            if busy or any(w.in_flight or not w.ready for w in workers):
                self._busy_at[role] = obs.now
            self._busy_at.setdefault(role, obs.now)

    def _idle(self, obs: Observation, pools: dict[str, list[WorkerView]]) -> list[Action]:
        """Stop a pool (min 0) that had nothing to do for ``zero_after_s``."""
        c = self.config
        for role, workers in pools.items():
            since = self._busy_at[role]
            if (
                workers
                and c.bounds(role).min == 0
                and c.min_workers == 0
                and obs.now - since >= c.zero_after_s
            ):
                why = f"nothing to do for {obs.now - since:.0f}s (zero_after_s {c.zero_after_s:g}): scaling to zero"
                return [RemoveWorker(w.worker_id, why) for w in workers]
        return []

    def _surge(self, obs: Observation, pools: dict[str, list[WorkerView]], wants: list[Want]) -> list[Action]:
        """Several adds at once for the most pressed pool asking for them (module docstring)."""
        c = self.config
        asks = sorted((w for w in wants if w.surge and w.role in pools), key=lambda w: -w.pressure)
        if not asks:
            return []
        w = asks[0]
        self._trim(obs.now)
        room = min(
            w.delta,
            c.bounds(w.role).max - len(pools[w.role]),
            c.total_max() - sum(len(p) for p in pools.values()),
            self._cap_room(+1),
            self._room(obs),
        )
        if room < 2:
            return []  # one worker or none: the ordinary path, with its holds
        return self._record(obs.now, [AddWorker(w.role, f"{w.reason} ({room} at once)") for _ in range(room)])

    def _cap_room(self, direction: int) -> int:
        """Adds (``+1``) or removals (``-1``) the cap still allows (``_changes`` already
        trimmed to the cap window; a switch counts in both directions)."""
        return self.config.change_cap() - sum(1 for _, d in self._changes if d in (direction, 0))

    def _step(self, asked: int, pool: int, room: int) -> int:
        """Workers one ordinary step moves: what the policy asked, at most ``step_share`` of
        the pool and ``room``, at least one."""
        share = math.ceil(self.config.step_share * pool) if self.config.step_share else 1
        return max(1, min(asked, share, room))

    def _bounds(self, pools: dict[str, list[WorkerView]], obs: Observation) -> Action | None:
        total = sum(len(p) for p in pools.values())
        for role, workers in pools.items():
            b = self.config.bounds(role)
            if len(workers) > b.max and self._cap_room(-1) > 0:
                victim = cheapest(workers, self.config.cache_block_cost)
                return RemoveWorker(victim.worker_id, f"{len(workers)} {role} workers > max {b.max}")
            if (
                len(workers) < b.min
                and total < self.config.total_max()
                and self._room(obs) > 0
                and self._cap_room(+1) > 0
            ):
                return AddWorker(role, f"{len(workers)} {role} workers < min {b.min}")
        return None

    def _act(self, pools: dict[str, list[WorkerView]], obs: Observation) -> list[Action]:
        c, wants = self.config, self.last_wants
        size = {r: len(p) for r, p in pools.items()}
        total = sum(size.values())
        grow = sorted(
            (w for w in wants if w.delta > 0 and size[w.role] < c.bounds(w.role).max),
            key=lambda w: -w.pressure,
        )
        shrink = sorted(
            (
                w
                for w in wants
                if w.delta < 0 and size[w.role] > c.bounds(w.role).min and any(v.ready for v in pools[w.role])
            ),
            key=lambda w: -w.pressure,
        )
        switchable = self._cap_room(+1) > 0 and self._cap_room(-1) > 0
        for g in grow if switchable else ():
            for s in shrink:
                if g.role in SWITCHABLE and s.role in SWITCHABLE and g.role != s.role:
                    victim = cheapest([v for v in pools[s.role] if v.ready], c.cache_block_cost)
                    return [
                        SwitchRole(victim.worker_id, g.role, f"{g.role}: {g.reason}; {s.role}: {s.reason}")
                    ]
        if grow and total < c.total_max() and self._room(obs) > 0:
            g = grow[0]
            room = min(
                c.bounds(g.role).max - size[g.role],
                c.total_max() - total,
                self._cap_room(+1),
                self._room(obs),
            )
            if room < 1:
                return []
            k = self._step(g.delta, size[g.role], room)
            return [AddWorker(g.role, g.reason + (f" ({k} at once)" if k > 1 else "")) for _ in range(k)]
        if shrink and total > c.min_workers:
            s = shrink[0]
            floor = max(c.bounds(s.role).min, 1)  # to zero only when idle (``_idle``)
            room = min(size[s.role] - floor, total - c.min_workers, self._cap_room(-1))
            if room < 1:
                return []
            k = self._step(-s.delta, size[s.role], room)
            why = s.reason + (f" ({k} at once)" if k > 1 else "")
            return [
                RemoveWorker(v.worker_id, why) for v in cheapest_first(pools[s.role], c.cache_block_cost)[:k]
            ]
        return []
