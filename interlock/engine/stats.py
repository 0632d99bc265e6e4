"""What the engine's step thread tells the worker's metrics (``interlock_engine_*``): counts, and
per-request times queued for the worker to observe at its next scrape. Appending and swapping a
list are each atomic under the GIL, so the step thread never waits on the worker's loop."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class EngineStats:
    preemptions: int = 0
    queue_s: list[float] = field(default_factory=list)
    """Per request, arrival to first step, since the last ``take``."""
    prefill_s: list[float] = field(default_factory=list)
    """Per request, first step to first token, since the last ``take``."""

    def take(self) -> tuple[list[float], list[float]]:
        """The times queued since the last call (each handed over once)."""
        queue, self.queue_s = self.queue_s, []
        prefill, self.prefill_s = self.prefill_s, []
        return queue, prefill
