"""What a policy answers: per pool, whether it should grow or may shrink, and why.

A policy only reads the observation; bounds, one-step-per-window, change caps, which worker to
remove and whether a grow plus a shrink become one role switch are the core's
(``planner.core``), the same for every policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from interlock.planner.state import Observation, WorkerView


@dataclass(frozen=True, slots=True)
class Want:
    role: str
    delta: int
    """> 0: the pool should grow by this many workers; < 0: it may shrink by this many and
    still be fine. The core moves at most ``step_share`` of the pool per step (at least one
    worker; ``planner.core``)."""
    pressure: float
    """How strongly (signal / threshold); the core serves the strongest first."""
    reason: str
    surge: bool = False
    """A grow that cannot wait: the core adds ``delta`` workers past its holds
    (``planner.core``)."""


class Policy(Protocol):
    def wants(self, obs: Observation, pools: dict[str, list[WorkerView]]) -> list[Want]:
        """``pools``: role -> its workers (ready or starting, not draining)."""
        ...

    def status(self) -> dict[str, object]:
        """What the policy saw and estimated at the last observation (``planner status``)."""
        ...
