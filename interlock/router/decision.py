"""What the router decided and why (``Decision``), and its counters (``RouterMetrics``).

A decision renders two ways: ``header()`` is short enough for a debug response header
(``x-interlock-route``), ``log_line()`` carries the best few candidates' costs for the logs.

``Decision`` and ``Candidate`` are frozen ``msgspec.Struct`` s, not dataclasses: a decision
makes four of them, and a frozen dataclass's constructor (``object.__setattr__`` per field)
cost about 4 µs of a 50 µs budget where these cost a few hundred nanoseconds. Neither can be
part of a reference cycle (strings and numbers, and a tuple of candidates), so the garbage
collector does not track them (``gc=False``): a decision adds nothing to its next pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec


class Candidate(msgspec.Struct, frozen=True, gc=False):
    worker_id: str
    cost_s: float
    """Estimated seconds to first token (``kv`` policy), or the policy's own score."""
    overlap_blocks: int


class Decision(msgspec.Struct, frozen=True, gc=False):
    request_id: str
    worker_id: str
    reason: str
    """Policy that picked the worker: kv, round-robin, random, least-loaded, power-of-two,
    session, route_key, route_key-spill, direct (a ``+queued`` suffix if it
    waited, ``+queued+gave_up`` if it waited for a busy worker holding more of its prefix until
    the hit was no longer worth the wait)."""
    overlap_blocks: int
    prompt_tokens: int
    block_size: int
    candidates: tuple[Candidate, ...] = ()
    """Best few workers, best first (kv policy only)."""
    decision_s: float = 0.0
    kv_loading: int = 0
    """Workers of the model whose KV state was still loading (a frontend that just started, a
    worker that just joined or lost events): the index knows less of them than they hold, so
    their share of this choice was by load alone."""

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens the router expects the worker to serve from its cache."""
        return min(self.overlap_blocks * self.block_size, self.prompt_tokens)

    def header(self) -> str:
        parts = [f"worker={self.worker_id}", f"reason={self.reason}", f"overlap={self.overlap_blocks}"]
        if self.candidates:
            parts.append(f"cost={self.candidates[0].cost_s:.4f}")
        if self.kv_loading:
            parts.append(f"kv_loading={self.kv_loading}")
        return "; ".join(parts)

    def log_line(self) -> str:
        cands = " ".join(f"{c.worker_id}:{c.cost_s:.4f}s/{c.overlap_blocks}b" for c in self.candidates)
        return (
            f"route {self.request_id} -> {self.worker_id} reason={self.reason} "
            f"overlap={self.overlap_blocks}b cached~{self.cached_tokens}/{self.prompt_tokens}tok "
            f"took={self.decision_s * 1e6:.0f}us best=[{cands}]"
        )


@dataclass(slots=True)
class RouterMetrics:
    decisions: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)
    prompt_tokens: int = 0
    predicted_cached_tokens: int = 0
    overlap_blocks: int = 0
    decision_s_total: float = 0.0
    decision_s_max: float = 0.0
    queued_by_role: dict[str, int] = field(default_factory=dict)
    """Queue entries by the role waited for ("any": a request of no role, an aggregated one):
    a disaggregated request may wait twice (for a prefill worker, then a decode worker)."""
    rejected: int = 0
    requests: int = 0
    """Requests placed, each once: not a disaggregated request's second leg, a probe for a free
    prefill worker, a retry or a migrated leg (``decisions`` counts every one of those)."""
    request_prompt_tokens: int = 0
    request_cached_tokens: int = 0
    """Prompt tokens expected from cache where each request's prompt is computed (the prefill
    worker's, for a request prefilled remotely)."""
    resyncs_requested: int = 0
    duplicate_batches: int = 0

    def record(self, d: Decision) -> None:
        self.decisions += 1
        by = self.by_reason
        by[d.reason] = by.get(d.reason, 0) + 1
        prompt = d.prompt_tokens
        self.prompt_tokens += prompt
        cached = d.overlap_blocks * d.block_size  # d.cached_tokens, without the property's call
        self.predicted_cached_tokens += cached if cached < prompt else prompt
        self.overlap_blocks += d.overlap_blocks
        took = d.decision_s
        self.decision_s_total += took
        if took > self.decision_s_max:  # max() without the call (the same first of equals)
            self.decision_s_max = took

    def record_request(self, prompt_tokens: int, cached_tokens: int) -> None:
        self.requests += 1
        self.request_prompt_tokens += prompt_tokens
        self.request_cached_tokens += min(cached_tokens, prompt_tokens)

    def record_queued(self, role: str | None) -> None:
        key = role or "any"
        self.queued_by_role[key] = self.queued_by_role.get(key, 0) + 1

    @property
    def queued(self) -> int:
        """Queue entries, every role (legs, not requests)."""
        return sum(self.queued_by_role.values())

    @property
    def hit_rate(self) -> float:
        """Share of prompt tokens the router expected to be cached where it sent them."""
        return self.predicted_cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def mean_decision_s(self) -> float:
        return self.decision_s_total / self.decisions if self.decisions else 0.0
