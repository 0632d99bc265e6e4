from __future__ import annotations

from dataclasses import replace

import pytest

from interlock.planner import (
    Arrival,
    Observation,
    PlannerConfig,
    RoleBounds,
    Traffic,
    WorkerView,
    build_planner,
)
from interlock.planner.tail import Job, StepTimes, miss_share, workers_needed
from tests.planner.conftest import mock_profile

STEPS = StepTimes(decode_s=0.01, chunk_s=0.2)


def burst(k: int, prefill_s: float, at: float = 0.0, osl: int = 1) -> list[Job]:
    return [Job(at, prefill_s, 1, osl) for _ in range(k)]


def test_a_burst_misses_the_ttft_on_too_few_workers() -> None:
    jobs = burst(8, 0.59)  # 0.6 s each with the decode step its chunk carries
    # one worker: first tokens at 0.6, 1.2, 1.8, 2.4, ... -> 5 of 8 over 2 s
    assert miss_share(jobs, 1, STEPS, 2.0, 0.05) == pytest.approx(5 / 8)
    assert miss_share(jobs, 2, STEPS, 2.0, 0.05) == pytest.approx(2 / 8)
    assert miss_share(jobs, 3, STEPS, 2.0, 0.05) == 0.0
    assert workers_needed(jobs, STEPS, 2.0, 0.05, 0.0) == 3
    assert workers_needed(jobs, STEPS, 2.0, 0.05, 0.25) == 2


def test_spread_out_requests_fit_on_one_worker_until_made_denser() -> None:
    jobs = [Job(float(t), 0.59, 1, 1) for t in range(10)]
    assert miss_share(jobs, 1, STEPS, 2.0, 0.05) == 0.0
    # four times as dense: 0.6 s of work every 0.25 s -> the queue grows
    assert miss_share(jobs, 1, STEPS, 2.0, 0.05, scale=4.0) > 0.3
    assert miss_share(jobs, 3, STEPS, 2.0, 0.05, scale=4.0) == 0.0


def test_a_prompt_longer_than_the_target_misses_on_any_number_of_workers() -> None:
    jobs = [Job(0.0, 3.0, 12, 10), Job(100.0, 0.1, 1, 10)]
    assert miss_share(jobs, 1, STEPS, 2.0, 0.05) == 0.5
    assert miss_share(jobs, 8, STEPS, 2.0, 0.05) == 0.5


def test_a_short_answer_decoding_next_to_a_long_prefill_misses_the_itl() -> None:
    # request 0 decodes 10 tokens (0.1 s alone); request 1's 1 s prefill follows on its worker
    jobs = [Job(0.0, 0.09, 1, 11), Job(0.05, 1.0, 5, 1)]
    assert miss_share(jobs, 1, STEPS, 2.0, 0.05) == 0.5  # ITL 0.01 + ~1 s / 10 tokens
    assert miss_share(jobs, 2, STEPS, 2.0, 0.05) == 0.0  # the long one goes elsewhere
    # a long answer absorbs it: 1 s over 1,000 tokens
    jobs = [Job(0.0, 0.09, 1, 1001), Job(0.05, 1.0, 5, 1)]
    assert miss_share(jobs, 1, STEPS, 2.0, 0.05) == 0.0


def test_sla_policy_sizes_by_the_tail_when_it_sees_requests_one_by_one() -> None:
    cfg = PlannerConfig(
        policy="sla",
        profile="unused.json",
        both=RoleBounds(1, 12),
        window_s=30.0,
        max_changes=100,
        attainment=0.9,
        tail=True,
    )

    def need(tail: bool) -> float:
        planner = build_planner(replace(cfg, tail=tail), mock_profile())
        workers = tuple(WorkerView(f"w{i}", "both") for i in range(2))
        for t in range(0, 120, 5):
            # 4 req/s on average, in one burst per 5 s of 20 prompts of 20k uncached tokens
            arrivals = tuple(Arrival(float(t), 20_000, 0, 50) for _ in range(20))
            tr = Traffic(5.0, 20, 400_000, 0, 1000, arrivals=arrivals)
            planner.decide(Observation(float(t), workers, traffic=tr))
        return planner.policy.last_need["both"]  # type: ignore[attr-defined,no-any-return]

    means, tail = need(False), need(True)
    # each burst is 20 prompts of ~0.45 s: within 2 s a worker gives 4 of them their first
    # token, so 10% misses at most takes 5 workers; the means (M/M/1) see 3.4
    assert means < 4 and tail == 5
