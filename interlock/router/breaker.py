"""Per-worker circuit breakers: repeated failures take a worker out of routing for a while.

A failure is a stream that broke (connection lost, stalled, aborted by the worker, a service
error). One failure already marks the worker unhealthy until its next load report or health
check says otherwise; the breaker is for the worker that keeps coming back and failing again
(a bad GPU, a crash loop, a wedged engine thread behind a live event loop).

States, per worker:
  closed     routed normally; ``failures`` failures within ``window_s`` open it;
  open       not routed for ``cooldown_s`` (doubled each time a probe fails, up to ``max_cooldown_s``);
  half-open  the cool-down is over: the next request routed there is the probe, and no other
             request goes there until the probe's first token (closed) or its failure (open).
             A probe that ends with neither (its request prefilled elsewhere, finished on
             another worker at its first token, or its client left) leaves it half-open: the
             next request is the probe.

Pure: every method takes ``now`` and returns what changed; the router service applies it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import Enum


class State(Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"
    PROBING = "probing"


@dataclass(frozen=True)
class BreakerConfig:
    failures: int = 3
    """Failures within ``window_s`` that open the breaker."""
    window_s: float = 30.0
    """How far back failures count."""
    cooldown_s: float = 5.0
    """How long an open breaker keeps the worker out before a probe."""
    max_cooldown_s: float = 60.0
    """The cooldown doubles after each failed probe, up to this."""
    incident_s: float = 1.0
    """Failures this close together are one incident (a dead worker breaks all its streams at once)."""


@dataclass
class _Breaker:
    state: State = State.CLOSED
    recent: deque[float] = field(default_factory=deque)
    cooldown_s: float = 0.0
    until: float = 0.0


class Breakers:
    def __init__(self, config: BreakerConfig = BreakerConfig()) -> None:
        self.config = config
        self._b: dict[str, _Breaker] = {}
        self.opened_total = 0

    def open_count(self) -> int:
        """Workers whose breaker is open now."""
        return sum(1 for b in self._b.values() if b.state is State.OPEN)

    def state(self, worker_id: str) -> State:
        b = self._b.get(worker_id)
        return b.state if b is not None else State.CLOSED

    def cooldown_s(self, worker_id: str) -> float:
        b = self._b.get(worker_id)
        return b.cooldown_s if b is not None else 0.0

    def blocked(self, worker_id: str) -> bool:
        """Not to be routed to now (open, or half-open with its probe in flight)."""
        return self.state(worker_id) in (State.OPEN, State.PROBING)

    def failure(self, worker_id: str, now: float) -> bool:
        """Record a failure; True when it opened the breaker (the worker leaves routing)."""
        b = self._b.setdefault(worker_id, _Breaker())
        c = self.config
        if b.state is State.OPEN:
            return False
        if b.state in (State.HALF_OPEN, State.PROBING):  # the probe failed: longer cool-down
            return self._open(b, now, min(max(b.cooldown_s, c.cooldown_s) * 2, c.max_cooldown_s))
        if b.recent and now - b.recent[-1] < c.incident_s:
            return False
        b.recent.append(now)
        while b.recent and b.recent[0] < now - c.window_s:
            b.recent.popleft()
        if len(b.recent) >= c.failures:
            return self._open(b, now, c.cooldown_s)
        return False

    def success(self, worker_id: str) -> bool:
        """A stream from the worker produced output; True when that closed an open breaker."""
        b = self._b.get(worker_id)
        if b is None:
            return False
        was = b.state
        del self._b[worker_id]
        return was is not State.CLOSED

    def dispatched(self, worker_id: str) -> bool:
        """A request was routed to the worker; True when it is the probe (block the rest)."""
        b = self._b.get(worker_id)
        if b is not None and b.state is State.HALF_OPEN:
            b.state = State.PROBING
            return True
        return False

    def unanswered(self, worker_id: str) -> bool:
        """The probe's request ended with neither output from the worker nor a failure; True
        when the worker was probing (it is half-open again: the next request is the probe)."""
        b = self._b.get(worker_id)
        if b is None or b.state is not State.PROBING:
            return False
        b.state = State.HALF_OPEN
        return True

    def tick(self, now: float) -> list[str]:
        """Workers whose cool-down ended now (half-open: eligible for one probe)."""
        out = []
        for wid, b in self._b.items():
            if b.state is State.OPEN and now >= b.until:
                b.state = State.HALF_OPEN
                out.append(wid)
        return out

    def tracked(self) -> int:
        """Workers with a breaker entry (one that failed recently, or is open or probing)."""
        return len(self._b)

    def forget(self, worker_id: str) -> None:
        self._b.pop(worker_id, None)

    def _open(self, b: _Breaker, now: float, cooldown_s: float) -> bool:
        b.state = State.OPEN
        b.cooldown_s = cooldown_s
        b.until = now + cooldown_s
        b.recent.clear()
        self.opened_total += 1
        return True
