"""The replay report: what one replay measured, and its text rendering."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from interlock.planner import DecisionRecord
from interlock.sim.worker import SimSeq


@dataclass(frozen=True)
class ReplayReport:
    policy: str
    num_requests: int
    num_completed: int
    num_rejected: int
    """Refused by the router (a deployment's 503): see ``rejected``."""
    rejected: dict[str, int]
    """Rejections by reason ("queue full": the admission queue was at capacity)."""
    hit_ratio: float
    """Prompt tokens served from the worker's prefix cache / all prompt tokens."""
    upper_bound: float
    """The same with one infinite cache (every earlier prefix reusable)."""
    pooled_bound: float
    """The same with one shared LRU cache as large as all workers' caches together."""
    ttft_p50_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    itl_p99_ms: float
    """Inter-token latency over all output tokens (token-weighted step times)."""
    tpot_mean_ms: float
    """Mean over requests of (finish - first token) / (output tokens - 1)."""
    requests_per_s: float
    output_tokens_per_s: float
    duration_s: float
    """Virtual time from the first arrival to the last finish."""
    inflight_imbalance: float
    """Busiest worker's time-averaged in-flight requests / the mean over workers."""
    requests_imbalance: float
    """Most requests routed to one worker / the mean."""
    decision_p50_us: float
    decision_p99_us: float
    wall_s: float
    ttft_slo_ms: float
    itl_slo_ms: float
    sla_attainment: float
    """Share of submitted requests (rejected ones included) whose TTFT and mean inter-token
    time both met the targets."""
    worker_seconds: float
    """Sum over workers of the time from start (or the planner's request) to stop."""
    planner_decisions: tuple[DecisionRecord, ...] = ()
    missed_arrivals_s: tuple[float, ...] = ()
    """Arrival times of the completed requests that missed the SLA (where in a trace they
    are lost; rejected requests are counted apart)."""

    @property
    def hit_vs_upper(self) -> float:
        return self.hit_ratio / self.upper_bound if self.upper_bound else 0.0

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["planner_decisions"] = [r.to_dict() for r in self.planner_decisions]
        return d

    def render(self) -> str:
        return "\n".join(
            [
                f"policy              {self.policy}",
                f"requests            {self.num_completed}/{self.num_requests} completed, "
                f"{self.num_rejected} rejected (503){self._reasons()}",
                f"prefix hit ratio    {self.hit_ratio:.3f}  (pooled-cache bound {self.pooled_bound:.3f}, "
                f"infinite-cache bound {self.upper_bound:.3f}, {100 * self.hit_vs_upper:.0f}% of it)",
                f"TTFT p50 / p99      {self.ttft_p50_ms:,.0f} / {self.ttft_p99_ms:,.0f} ms",
                f"ITL p50 / p99       {self.itl_p50_ms:.1f} / {self.itl_p99_ms:.1f} ms "
                f"(mean TPOT {self.tpot_mean_ms:.1f} ms)",
                f"throughput          {self.requests_per_s:.2f} req/s, {self.output_tokens_per_s:,.0f} output tok/s "
                f"over {self.duration_s:,.1f} s virtual",
                f"load imbalance      in-flight max/mean {self.inflight_imbalance:.2f}, "
                f"requests max/mean {self.requests_imbalance:.2f}",
                f"router decision     p50 {self.decision_p50_us:.0f} us, p99 {self.decision_p99_us:.0f} us",
                f"SLA attainment      {100 * self.sla_attainment:.1f}% (TTFT <= {self.ttft_slo_ms:g} ms "
                f"and ITL <= {self.itl_slo_ms:g} ms)",
                f"worker-seconds      {self.worker_seconds:,.0f} (mean {self.mean_workers:.2f} workers)",
                *self._decisions(),
                f"replay wall time    {self.wall_s:.1f} s",
            ]
        )

    @property
    def mean_workers(self) -> float:
        return self.worker_seconds / self.duration_s if self.duration_s else 0.0

    def _decisions(self) -> list[str]:
        if not self.planner_decisions:
            return []
        return [
            f"planner decisions   {len(self.planner_decisions)}",
            *(f"  {r.line()}" for r in self.planner_decisions),
        ]

    def _reasons(self) -> str:
        if not self.rejected:
            return ""
        return ": " + ", ".join(f"{why} {n}" for why, n in sorted(self.rejected.items()))


def pct(a: np.ndarray, q: float) -> float:
    return float(np.percentile(a, q)) if len(a) else 0.0


def weighted_percentile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    if len(values) == 0:
        return 0.0
    order = np.argsort(values)
    v, w = values[order], weights[order]
    cum = np.cumsum(w)
    return float(v[np.searchsorted(cum, q / 100.0 * cum[-1])])


def build_report(
    *,
    policy: str,
    done: Sequence[SimSeq],
    upper_bound: float,
    pooled_bound: float,
    itl_s: np.ndarray,
    itl_w: np.ndarray,
    inflight_area: dict[str, float],
    duration_s: float,
    per_worker_requests: dict[str, int],
    decision_s: np.ndarray,
    wall_s: float,
    num_submitted: int,
    rejected: dict[str, int] | None = None,
    worker_seconds: float = 0.0,
    slo_ms: tuple[float, float] = (2000.0, 50.0),
    decisions: tuple[DecisionRecord, ...] = (),
) -> ReplayReport:
    ttft = np.asarray([_ttft_s(s) for s in done]) * 1000.0
    dur = max(duration_s, 1e-9)
    missed = _missed_arrivals(done, slo_ms)
    return ReplayReport(
        policy=policy,
        num_requests=num_submitted,
        num_completed=len(done),
        num_rejected=sum((rejected or {}).values()),
        rejected=dict(rejected or {}),
        hit_ratio=_hit_ratio(done),
        upper_bound=upper_bound,
        pooled_bound=pooled_bound,
        ttft_p50_ms=pct(ttft, 50),
        ttft_p99_ms=pct(ttft, 99),
        itl_p50_ms=weighted_percentile(itl_s, itl_w, 50) * 1000.0,
        itl_p99_ms=weighted_percentile(itl_s, itl_w, 99) * 1000.0,
        tpot_mean_ms=_mean_tpot_ms(done),
        requests_per_s=len(done) / dur,
        output_tokens_per_s=sum(s.req.output_tokens for s in done) / dur,
        duration_s=duration_s,
        inflight_imbalance=_imbalance(np.asarray(list(inflight_area.values()))),
        requests_imbalance=_imbalance(np.asarray(list(per_worker_requests.values()), dtype=float)),
        decision_p50_us=pct(decision_s, 50) * 1e6,
        decision_p99_us=pct(decision_s, 99) * 1e6,
        wall_s=wall_s,
        ttft_slo_ms=slo_ms[0],
        itl_slo_ms=slo_ms[1],
        sla_attainment=(len(done) - len(missed)) / num_submitted if num_submitted else 0.0,
        worker_seconds=worker_seconds,
        planner_decisions=decisions,
        missed_arrivals_s=missed,
    )


def _ttft_s(s: SimSeq) -> float:
    """From the request's arrival: time waiting in the router's queue counts."""
    return s.first_token_s - s.req.arrival_s


def _tpot_s(s: SimSeq) -> float | None:
    """Mean time per output token after the first (None: a single output token)."""
    if s.req.output_tokens <= 1:
        return None
    return (s.finish_s - s.first_token_s) / (s.req.output_tokens - 1)


def _mean_tpot_ms(done: Sequence[SimSeq]) -> float:
    tpot = [t * 1000.0 for s in done if (t := _tpot_s(s)) is not None]
    return float(np.mean(tpot)) if tpot else 0.0


def _missed_arrivals(done: Sequence[SimSeq], slo_ms: tuple[float, float]) -> tuple[float, ...]:
    """Arrival times, sorted, of the requests whose TTFT or TPOT missed its target."""
    ttft_slo, itl_slo = slo_ms[0] / 1000.0, slo_ms[1] / 1000.0
    return tuple(
        sorted(
            s.req.arrival_s
            for s in done
            if _ttft_s(s) > ttft_slo or ((tpot := _tpot_s(s)) is not None and tpot > itl_slo)
        )
    )


def _hit_ratio(done: Sequence[SimSeq]) -> float:
    prompt = sum(s.req.prompt_tokens for s in done)
    return sum(s.hit_tokens for s in done) / prompt if prompt else 0.0


def _imbalance(loads: np.ndarray) -> float:
    """The largest of ``loads`` over their mean (1 when there is no load)."""
    return float(loads.max() / loads.mean()) if loads.mean() > 0 else 1.0
