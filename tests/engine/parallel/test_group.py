"""GroupRunner: the real model over T x P rank processes equals one process (fp32), and a rank
that dies is reported."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from interlock.engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from interlock.engine.parallel.group import GroupRunner
from interlock.engine.runner import ModelRunner, ScheduledRequest, SchedulerOutput
from interlock.engine.runners.torch_runner import TorchRunner
from interlock.errors import ConfigError
from interlock.protocol import SamplingParams

ASK = SamplingParams(temperature=0.0, logprobs=2)
PROMPT = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3717, 314, 20389, 7018, 28, 7018, 2, 198]
PROMPT += [1, 4093, 198, 19556, 30, 2, 198, 1, 520, 9531, 198, 17, 17, 17]
TOLERANCE = 1e-4
"""fp32 logprobs of a group against one process: partial sums add up in another order."""


def _config(tensor: int, pipeline: int) -> EngineConfig:
    return EngineConfig(
        model=ModelConfig(
            dtype="float32", tensor_parallel_size=tensor, pipeline_parallel_size=pipeline, num_threads=2
        ),
        cache=CacheConfig(num_blocks=32),
        scheduler=SchedulerConfig(max_model_len=256),
    )


def _req(rid: str, ids: list[int], start: int, table: list[int], sample: bool = True) -> ScheduledRequest:
    return ScheduledRequest(rid, ids, start, table, ASK, do_sample=sample)


def _run(runner: ModelRunner) -> list[tuple[dict[str, int], dict[str, float]]]:
    """Prefill, a chunked prefill, a prefix hit and decode steps of three requests at once."""
    steps = []

    def step(*scheduled: ScheduledRequest) -> dict[str, int]:
        out = runner.execute(SchedulerOutput(list(scheduled)))
        logprobs = {k: v.logprob for k, v in out.logprobs.items()}
        for rid, rows in out.prompt_logprobs.items():
            logprobs |= {f"{rid}@{k}": row.logprob for k, row in enumerate(rows)}
        steps.append((out.sampled, logprobs))
        return out.sampled

    first = step(_req("a", PROMPT, 0, [0, 1]), _req("b", PROMPT[:20], 0, [2, 3], sample=False))
    second = step(_req("b", PROMPT[20:], 20, [2, 3]), _req("c", PROMPT[16:], 16, [0, 4]))
    tokens = {"a": first["a"], **second}
    lengths = {"a": len(PROMPT), "b": len(PROMPT), "c": len(PROMPT)}
    tables = {"a": [0, 1, 5], "b": [2, 3, 6], "c": [0, 4, 7]}
    for _ in range(5):
        out = step(*(_req(r, [tokens[r]], lengths[r], tables[r]) for r in tokens))
        tokens = out
        lengths = {r: n + 1 for r, n in lengths.items()}
    # One long prompt alone, with prompt logprobs (a pipeline cuts it into pieces).
    long = PROMPT * 3
    asks = SamplingParams(temperature=0.0, logprobs=2, prompt_logprobs=1)
    whole = ScheduledRequest(
        "d",
        long,
        0,
        [8, 9, 10, 11, 12, 13, 14],
        asks,
        do_sample=True,
        prompt_token_ids=long,
        prompt_logprob_positions=range(len(long) - 1),
    )
    step(whole)
    return steps


@pytest.fixture(scope="module")
def one_process() -> list[tuple[dict[str, int], dict[str, float]]]:
    runner = TorchRunner.from_config(_config(1, 1))
    return _run(runner)


@pytest.mark.parametrize(("tensor", "pipeline"), [(2, 1), (1, 2), (2, 2)])
def test_a_group_computes_what_one_process_does(
    one_process: list[tuple[dict[str, int], dict[str, float]]], tensor: int, pipeline: int
) -> None:
    lost: list[str] = []
    runner = GroupRunner.from_config(_config(tensor, pipeline), on_lost=lost.append)
    try:
        got = _run(runner)
    finally:
        runner.close()
    assert [sampled for sampled, _ in got] == [sampled for sampled, _ in one_process]
    for (_, lp), (_, want) in zip(got, one_process, strict=True):
        assert lp.keys() == want.keys()
        assert all(abs(lp[r] - want[r]) < TOLERANCE for r in lp)
    assert lost == []  # a closed group is not a lost one


def test_a_rank_that_dies_takes_the_group_down() -> None:
    lost: list[str] = []
    said = threading.Event()

    def on_lost(why: str) -> None:
        lost.append(why)
        said.set()

    runner = GroupRunner.from_config(_config(2, 1), on_lost=on_lost)
    try:
        os.kill(runner.ranks.procs[0].pid, signal.SIGKILL)
        assert said.wait(30)
        assert lost[0] == f"rank 1 exited with code {-signal.SIGKILL}"
        with pytest.raises(Exception, match="rank 1"):
            runner.execute(SchedulerOutput([_req("a", PROMPT, 0, [0, 1])]))
    finally:
        runner.close()


def test_a_cut_the_model_does_not_allow_is_refused_before_any_rank_starts() -> None:
    with pytest.raises(ConfigError, match="tensor_parallel_size 10 exceeds the model's 9 attention heads"):
        GroupRunner.from_config(_config(10, 1))


def test_ranks_of_a_cpu_group_share_the_cpu() -> None:
    from interlock.engine.parallel.group import rank_devices

    assert rank_devices("cpu", 3) == ["cpu", "cpu", "cpu"]
