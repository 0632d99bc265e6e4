"""TorchRunner: the ModelRunner contract on the real model (sampling rows, logprobs, penalties
over the request's tokens, KV export and import between two runners, construction from an
EngineConfig)."""

from __future__ import annotations

import pytest
import torch

from interlock.engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from interlock.engine.core import EngineCore
from interlock.engine.model import LlamaModel, block_nbytes
from interlock.engine.runner import ScheduledRequest, SchedulerOutput
from interlock.engine.runners.torch_runner import TorchRunner
from interlock.errors import ConfigError
from interlock.model_store import resolve_model
from interlock.protocol import GenerateRequest, SamplingParams
from tests.engine.conftest import run_to_end, tokens

GREEDY = SamplingParams(temperature=0.0)
PROMPT = [
    1,
    9690,
    198,
    2683,
    359,
    253,
    5356,
    5646,
    11173,
    3365,
    3717,
    314,
    20389,
    7018,
    28,
    7018,
    2,
    198,
    1,
    4093,
    198,
    19556,
    30,
    2,
    198,
    1,
    520,
    9531,
    198,
    17,
    17,
    17,
    17,
    17,
    17,
    17,
]


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    return LlamaModel.load(resolve_model("smollm2", progress=False), torch.float32, torch.device("cpu"), 256)


def _request(
    rid: str,
    tokens: list[int],
    start: int,
    table: list[int],
    *,
    sample: bool = True,
    sampling: SamplingParams = GREEDY,
) -> ScheduledRequest:
    return ScheduledRequest(rid, tokens, start, table, sampling, do_sample=sample)


def _generate(runner: TorchRunner, rid: str, prompt: list[int], table: list[int], steps: int) -> list[int]:
    out = runner.execute(SchedulerOutput([_request(rid, prompt, 0, table)])).sampled[rid]
    tokens = [out]
    for _ in range(steps - 1):
        pos = len(prompt) + len(tokens) - 1
        step = SchedulerOutput([_request(rid, [tokens[-1]], pos, table)])
        tokens.append(runner.execute(step).sampled[rid])
    return tokens


def test_runner_shape(model: LlamaModel) -> None:
    runner = TorchRunner(model, num_blocks=8)
    assert runner.vocab_size == 49152 and runner.eos_token_ids == (2,)
    assert runner.kv_block_nbytes == block_nbytes(model.config, 16, torch.float32) == 30 * 2 * 3 * 16 * 64 * 4


def test_only_rows_that_end_their_known_tokens_sample(model: LlamaModel) -> None:
    runner = TorchRunner(model, num_blocks=8)
    partial = _request("a", PROMPT[:20], 0, [0, 1, 2], sample=False)
    asks = _request("b", PROMPT[:5], 0, [3], sampling=SamplingParams(temperature=0.0, logprobs=2))
    out = runner.execute(SchedulerOutput([partial, asks]))
    assert set(out.sampled) == {"b"} and set(out.logprobs) == {"b"}
    lp = out.logprobs["b"]
    assert lp.token_id == out.sampled["b"] == lp.top[0][0] and len(lp.top) == 2
    assert runner.execute(SchedulerOutput([])).sampled == {}


def test_chunked_prefill_equals_one_shot(model: LlamaModel) -> None:
    runner = TorchRunner(model, num_blocks=16)
    one_shot = _generate(runner, "a", PROMPT, [0, 1, 2, 3], steps=4)
    first = _request("b", PROMPT[:17], 0, [8, 5, 9, 10], sample=False)
    runner.execute(SchedulerOutput([first]))
    rest = runner.execute(SchedulerOutput([_request("b", PROMPT[17:], 17, [8, 5, 9, 10])]))
    assert rest.sampled["b"] == one_shot[0]


def test_exported_kv_imported_into_another_runner_continues_identically(model: LlamaModel) -> None:
    source, dest = TorchRunner(model, num_blocks=12), TorchRunner(model, num_blocks=12)
    src_table, dst_table = [4, 9, 1, 7], [11, 0, 6, 3]
    expected = _generate(source, "r", PROMPT, src_table, steps=6)
    # Prefill on the source again (fresh blocks), ship the 3 prompt blocks, decode on dest.
    first = source.execute(SchedulerOutput([_request("r", PROMPT, 0, src_table)])).sampled["r"]
    used = src_table[:3]  # 36 prompt tokens -> 3 blocks of 16
    buffer = bytearray(len(used) * source.kv_block_nbytes)
    source.export_blocks(used, memoryview(buffer))
    dest.import_blocks(dst_table[:3], memoryview(bytes(buffer)))  # read-only on purpose
    tokens = [first]
    for _ in range(5):
        step = SchedulerOutput([_request("r", [tokens[-1]], len(PROMPT) + len(tokens) - 1, dst_table)])
        tokens.append(dest.execute(step).sampled["r"])
    assert tokens == expected
    again = bytearray(len(buffer))
    dest.export_blocks(dst_table[:3], memoryview(again))
    assert again == buffer
    with pytest.raises(ValueError):
        dest.import_blocks([0], memoryview(bytes(buffer)))  # wrong size


def test_from_config_resolves_the_model_and_sizes_the_pool() -> None:
    config = EngineConfig(
        model=ModelConfig(model="smollm2", dtype="bfloat16"),
        cache=CacheConfig(block_size=32, kv_cache_gib=0.25),
        scheduler=SchedulerConfig(max_model_len=1024, max_num_batched_tokens=1024),
    )
    runner = TorchRunner.from_config(config)
    assert runner.block_size == 32 and runner.model.dtype == torch.bfloat16
    assert runner.num_blocks == (1 << 28) // runner.kv_block_nbytes
    assert runner.execute(SchedulerOutput([_request("a", PROMPT, 0, [0, 1])])).sampled["a"] >= 0
    with pytest.raises(ConfigError, match="dtype"):
        TorchRunner.from_config(EngineConfig(model=ModelConfig(dtype="int3")))


def _greedy(core: EngineCore, rid: str, resume: tuple[int, ...] = (), **penalties: float) -> list[int]:
    sampling = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, **penalties)
    core.add_request(
        GenerateRequest(request_id=rid, token_ids=tuple(PROMPT), sampling=sampling, resume_token_ids=resume)
    )
    return tokens(run_to_end(core)[rid])


def test_penalties_see_the_requests_tokens_through_the_engine(model: LlamaModel) -> None:
    """The scheduler hands the runner the prompt and output: a greedy repeat (newline, 198, twice)
    gives way to a frequency or presence penalty from the second token on, a repetition penalty
    (198 is in the prompt) changes the first; a migrated request's resume tokens count as output."""
    config = EngineConfig(
        model=ModelConfig(dtype="float32"),
        cache=CacheConfig(block_size=16, num_blocks=16),
        scheduler=SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=4, max_model_len=256),
    )
    core = EngineCore(config, TorchRunner(model, num_blocks=16, block_size=16, seed=0))
    plain = _greedy(core, "plain")
    assert plain[:2] == [198, 198]
    frequency = _greedy(core, "frequency", frequency_penalty=2.0)
    assert frequency[0] == 198 and frequency[1] != 198
    assert _greedy(core, "presence", presence_penalty=2.0)[:2] == frequency[:2]
    assert _greedy(core, "repetition", repetition_penalty=1.5)[0] != 198
    resumed = _greedy(core, "resumed", resume=(198,), frequency_penalty=2.0)
    assert resumed == frequency[1:]
