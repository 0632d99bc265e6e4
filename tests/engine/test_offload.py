"""Weights that leave while idle: the torch runner drops them and loads them back on the next
step; the engine core drops them after ``offload_after_s`` without a request."""

from __future__ import annotations

import pytest

from interlock.engine.clock import VirtualClock
from interlock.engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from interlock.engine.core import EngineCore
from interlock.engine.runner import RunnerOutput, SchedulerOutput
from interlock.engine.runners.mock import MockRunner
from interlock.engine.runners.torch_runner import TorchRunner
from interlock.errors import ConfigError
from interlock.model_store import footprint, resolve_model
from interlock.protocol import GenerateRequest, SamplingParams
from tests.engine.conftest import EOS, VOCAB, make_config, run_to_end, tokens

PROMPT = (1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3717, 314, 20389, 7018, 28, 7018, 2, 198)


def _config(after: float) -> EngineConfig:
    return EngineConfig(
        model=ModelConfig(dtype="float32", offload_after_s=after),
        cache=CacheConfig(block_size=16, num_blocks=32),
        scheduler=SchedulerConfig(max_model_len=256, max_num_batched_tokens=256),
    )


def _greedy(core: EngineCore, rid: str) -> list[int]:
    sampling = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    core.add_request(GenerateRequest(request_id=rid, token_ids=PROMPT, sampling=sampling))
    return tokens(run_to_end(core)[rid])


def test_an_idle_model_drops_its_weights_and_the_next_request_brings_them_back() -> None:
    clock = VirtualClock()
    runner = TorchRunner.from_config(_config(30.0))
    core = EngineCore(_config(30.0), runner, clock=clock)
    first = _greedy(core, "a")
    clock.advance(29.0)
    core.idle()
    assert runner.resident and not core.offload_due()
    clock.advance(1.0)
    assert core.offload_due()
    core.idle()
    assert not runner.resident and runner.offloads == 1 and not core.offload_due()
    # The prefix blocks stayed: the request after the reload hits them and answers the same.
    assert _greedy(core, "b") == first
    assert runner.resident and runner.reloads == 1 and runner.last_reload_s > 0
    figures = core.scheduler.stats.registry.render()
    assert "interlock_engine_weight_offloads_total 1" in figures
    assert "interlock_engine_weight_load_seconds_count 1" in figures
    core.check_integrity()


def test_the_load_report_says_how_long_the_weights_take_and_a_prefetch_brings_them_back() -> None:
    clock = VirtualClock()
    runner = TorchRunner.from_config(_config(5.0))
    core = EngineCore(_config(5.0), runner, clock=clock)
    first = _greedy(core, "a")
    assert core.load.weights_load_s == 0.0
    clock.advance(5.0)
    assert core.idle() and not runner.resident
    # Until a reload is timed, the first load's time is the estimate.
    assert core.load.weights_load_s == runner.weights_load_s > 0
    took = core.load_weights()  # the router's prefetch, before any request
    assert took > 0 and runner.resident and runner.reloads == 1
    assert core.load.weights_load_s == 0.0 and core.load_weights() == 0.0
    assert not core.offload_due()  # a prefetch counts as activity: the idle clock starts again
    assert _greedy(core, "b") == first and runner.reloads == 1  # no second load
    assert "interlock_engine_weight_load_seconds_count 1" in core.scheduler.stats.registry.render()


def test_a_load_records_what_the_weights_hold_for_placement() -> None:
    runner = TorchRunner.from_config(_config(0.0))
    held = runner.model.weights.nbytes
    # Every layout a kernel keeps holds each parameter in at least bf16 (the files' dtype): the
    # fp32 ``small`` kernel keeps its weights as bf16, oneDNN's packing and the plain weight as
    # fp32. Which ones a layer keeps is measured on the machine (``kernel_choice``), so the
    # footprint lies between the files' size and every layout at once (bf16 + 2 x fp32).
    files = sum(f.stat().st_size for f in resolve_model("smollm2", progress=False).glob("*.safetensors"))
    assert files * 0.95 <= held <= 5 * files
    assert footprint.measured(resolve_model("smollm2", progress=False), "float32") == held


def test_without_a_setting_the_weights_stay() -> None:
    clock = VirtualClock()
    runner = TorchRunner.from_config(_config(0.0))
    core = EngineCore(_config(0.0), runner, clock=clock)
    _greedy(core, "a")
    clock.advance(1e6)
    core.idle()
    assert runner.resident and runner.offloads == 0


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"offload_after_s": -1}, "must be >= 0"),
        ({"runner": "mock", "offload_after_s": 5}, "the mock runner has no weights"),
        ({"tensor_parallel_size": 2, "offload_after_s": 5}, "of one rank"),
        ({"engine": "vllm", "offload_after_s": 5}, "vLLM's sleep mode needs a CUDA device"),
    ],
)
def test_settings_that_cannot_work_are_refused(fields: dict[str, object], why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        ModelConfig(**fields)  # type: ignore[arg-type]


def test_vllm_on_cuda_may_sleep() -> None:
    assert ModelConfig(engine="vllm", device="cuda:0", offload_after_s=5).offload_after_s == 5


class _Offloading(MockRunner):
    """The mock runner, with weights that leave and take ``LOAD_S`` to come back inside the
    next step (as ``TorchRunner.model`` loads them)."""

    LOAD_S = 2.0

    def __init__(self) -> None:
        super().__init__(num_blocks=64, block_size=4, vocab_size=VOCAB, eos_token_ids=(EOS,))
        self.out = False
        self.last_reload_s = 0.0

    def offload(self) -> bool:
        self.out = True
        return True

    @property  # type: ignore[override]
    def weights_load_s(self) -> float:
        return self.LOAD_S if self.out else 0.0

    def execute(self, batch: SchedulerOutput) -> RunnerOutput:
        result = super().execute(batch)
        if self.out:
            self.out, self.last_reload_s = False, self.LOAD_S
            self.last_step_time_s += self.LOAD_S
        return result


def test_the_speeds_reported_after_a_reload_are_the_models_not_the_loads() -> None:
    # The router prices a worker by the step times it reports: a reload counted as compute
    # made a warm worker look slower than an offloaded one and sent it the next request.
    prompt = list(range(10, 42))
    reports = []
    for offloaded in (False, True):
        runner = _Offloading()
        core = EngineCore(make_config(), runner, clock=VirtualClock())
        if offloaded:
            runner.offload()
        sampling = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
        core.add_request(GenerateRequest(request_id="a", token_ids=tuple(prompt), sampling=sampling))
        run_to_end(core)
        reports.append(core.load)
    warm, reloaded = reports
    assert reloaded.weights_load_s == 0.0 and reloaded.busy_s == warm.busy_s + _Offloading.LOAD_S
    assert reloaded.step_time_s == pytest.approx(warm.step_time_s, rel=1e-9)
    assert reloaded.prefill_tokens_per_s == pytest.approx(warm.prefill_tokens_per_s, rel=1e-9)
    assert warm.prefill_tokens_per_s > 0
