"""What the engine's step thread tells the worker's metrics (``interlock_engine_*``): the queue
and prefill time of each request, observed by the step thread into histograms of a registry of
their own (fixed size, however long nobody scrapes), which the worker's registry includes, and
the preemptions. Only the step thread writes; a scrape reads."""

from __future__ import annotations

from interlock.metrics import Registry


class EngineStats:
    def __init__(self) -> None:
        self.registry = Registry()
        self.queue_time = self.registry.histogram("interlock_engine_queue_time_seconds")
        """Per request, arrival to first step."""
        self.prefill_time = self.registry.histogram("interlock_engine_prefill_time_seconds")
        """Per request, first step to first token."""
        self.preemptions = 0
        self.weight_loads = self.registry.histogram("interlock_engine_weight_load_seconds")
        """Each load of weights that had been offloaded (idle): its count is the loads."""
        self.weight_offloads = self.registry.counter("interlock_engine_weight_offloads_total")
