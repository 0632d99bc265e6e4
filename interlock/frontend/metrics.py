"""The frontend's own figures, labelled by model and endpoint, in the process's registry
(``interlock.metrics``; names, labels and meaning in ``docs/metrics.md``)."""

from __future__ import annotations

from interlock.metrics import Registry
from interlock.metrics.process import register_process


class FrontendMetrics:
    def __init__(self, registry: Registry | None = None) -> None:
        self.registry = r = registry if registry is not None else Registry()
        self.requests = r.counter("interlock_http_requests_total")
        self.finished = r.counter("interlock_requests_total")
        self.in_flight = r.gauge("interlock_requests_in_flight")
        self.shed = r.counter("interlock_http_shed_total")
        self.ttft = r.histogram("interlock_time_to_first_token_seconds")
        self.itl = r.histogram("interlock_inter_token_latency_seconds")
        self.e2e = r.histogram("interlock_request_duration_seconds")
        self.prompt_lengths = r.histogram("interlock_request_prompt_tokens")
        self.completion_lengths = r.histogram("interlock_request_completion_tokens")
        self.prompt_tokens = r.counter("interlock_prompt_tokens_total")
        self.completion_tokens = r.counter("interlock_completion_tokens_total")
        self.cached_tokens = r.counter("interlock_prompt_tokens_cached_total")
        self.cache_miss_tokens = r.counter("interlock_kv_cache_miss_tokens_total")
        register_process(r, "frontend")

    def render(self, groups: frozenset[str] | None = None) -> str:
        return self.registry.render(groups)
