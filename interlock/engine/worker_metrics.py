"""A worker's own figures (``interlock_engine_*``, ``interlock_kv_transfer*``, process figures;
docs/metrics.md), served on its ``/metrics`` port. Per-request figures are observed from the
stream the worker relays, whichever engine runs; queue and prefill times and preemptions come
from an engine that keeps them (``engine_stats()``: Interlock's), taken at each scrape."""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter

from interlock.engine.disagg import HandoffCounters
from interlock.engine.stats import EngineStats
from interlock.metrics import Registry
from interlock.metrics.process import register_process
from interlock.protocol import GenerateOutput, LoadReport


class WorkerMetrics:
    def __init__(
        self,
        *,
        stats: Callable[[], EngineStats] | None,
        load: Callable[[], LoadReport | None],
        handoff: Callable[[], HandoffCounters | None],
        block_size: int,
    ) -> None:
        self.registry = r = Registry()
        self._stats = stats
        self._load = load
        self._handoff = handoff
        self._block_size = block_size
        self.finished = r.counter("interlock_engine_requests_total")
        self.decode_time = r.histogram("interlock_engine_decode_time_seconds")
        self.ttft = r.histogram("interlock_engine_time_to_first_token_seconds")
        self.prompt_tokens = r.counter("interlock_engine_prompt_tokens_total")
        self.generation_tokens = r.counter("interlock_engine_generation_tokens_total")
        self.device_hits = r.counter("interlock_engine_prefix_cache_hits_total")
        # every prompt token is looked up in the prefix cache: the queries are the prompt tokens
        r.collect(
            "interlock_engine_prefix_cache_queries_total", lambda: list(self.prompt_tokens.values.items())
        )
        r.collect("interlock_engine_preemptions_total", self._preemptions)
        r.collect("interlock_engine_running_requests", lambda: self._report(lambda x: x.num_running))
        r.collect("interlock_engine_waiting_requests", lambda: self._report(lambda x: x.num_waiting))
        r.collect("interlock_engine_kv_usage_ratio", lambda: self._report(lambda x: x.kv_usage))
        r.collect("interlock_kv_transfers_total", lambda: self._transfers(lambda c: c.transports))
        r.collect("interlock_kv_transfer_bytes_total", lambda: self._transfers(lambda c: c.transfer_bytes))
        r.collect("interlock_kv_transfer_seconds_total", lambda: self._transfers(lambda c: c.transfer_s))
        if stats is not None:  # queue and prefill times, observed by the engine's step thread
            r.include(stats().registry)
        register_process(r, "worker")

    def render(self) -> str:
        self._tier_hits()
        return self.registry.render()

    def request(self) -> RequestFigures:
        return RequestFigures(self)

    def _preemptions(self) -> list[tuple[tuple[str, ...], float]]:
        return [((), self._stats().preemptions)] if self._stats is not None else []  # unknown: none

    def _report(self, get: Callable[[LoadReport], float]) -> list[tuple[tuple[str, ...], float]]:
        report = self._load()
        return [((), get(report))] if report is not None else []

    def _transfers(
        self, table: Callable[[HandoffCounters], dict[str, int] | dict[str, float]]
    ) -> list[tuple[tuple[str, ...], float]]:
        counters = self._handoff()
        return [((t,), n) for t, n in sorted(table(counters).items())] if counters is not None else []

    def _tier_hits(self) -> None:
        """Hits of the tiers below the device pool, in tokens, from the last load report."""
        report = self._load()
        if report is None:
            return
        for t in report.kv_tiers:
            self.device_hits.values[(t.tier,)] = float(t.hits * self._block_size)


class RequestFigures:
    """One request's figures, observed from the outputs the worker relays."""

    __slots__ = ("_m", "_arrived", "_first", "_last", "_prompt", "_cached", "_tokens", "_finish")

    def __init__(self, metrics: WorkerMetrics) -> None:
        self._m = metrics
        self._arrived = perf_counter()
        self._first = 0.0
        self._last = 0.0
        self._prompt = self._cached = self._tokens = 0
        self._finish = "abort"

    def output(self, out: GenerateOutput) -> None:
        """Per chunk: a clock read and an add; the figures are observed at the first token and
        at the end (``closed``)."""
        if out.token_ids:
            now = perf_counter()
            if not self._first:
                self._first = now
                self._prompt, self._cached = out.num_prompt_tokens, out.num_cached_tokens
                m = self._m
                m.ttft.observe(now - self._arrived)
                m.prompt_tokens.inc((), out.num_prompt_tokens)
                m.device_hits.inc(("any",), out.num_cached_tokens)
            self._last = now
            self._tokens += len(out.token_ids)
        if out.finish_reason is not None:
            self._finish = out.finish_reason

    def line(self, finished: bool) -> str:
        """The worker's access line for it (after the request id)."""
        ttft = (self._first - self._arrived) * 1000 if self._first else -1.0
        return (
            f"finish={self._finish if finished else 'abort'} prompt={self._prompt} cached={self._cached} "
            f"completion={self._tokens} ttft_ms={ttft:.1f} ms={(perf_counter() - self._arrived) * 1000:.1f}"
        )

    def span_attributes(self, finished: bool) -> dict[str, str | int]:
        """Its figures for the worker's trace span (``metrics.tracing``)."""
        return {
            "finish_reason": self._finish if finished else "abort",
            "prompt_tokens": self._prompt,
            "cached_tokens": self._cached,
            "completion_tokens": self._tokens,
        }

    def closed(self, finished: bool) -> None:
        """The stream ended; ``finished``: with a finish reason (else the client left: abort)."""
        m = self._m
        m.finished.inc((self._finish if finished else "abort",))
        m.generation_tokens.inc((), self._tokens)
        if finished and self._first:
            m.decode_time.observe(self._last - self._first)
