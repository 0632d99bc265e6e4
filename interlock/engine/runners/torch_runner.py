"""The real model runner: a Llama-family model in PyTorch over a paged KV cache.

Per step it turns the scheduler's chunks into one flat batch (``model.batch``), runs the
forward pass (which writes every computed token's K/V into the slots of its block table),
and samples one token for each request whose chunk ends at its last known token. It holds no
per-request state: everything a step needs is in the ``SchedulerOutput`` (block tables,
start positions, and the output count that seeds per-request sampling), so preemption,
prefix hits and imported KV need nothing from the runner. The one exception, structured
outputs' grammar matchers (``engine.constraints``), is a cache: a matcher that disagrees with
the request's outputs is rebuilt from them.

Prompt logprobs: a chunk with ``prompt_logprob_positions`` asks the model for the logits of
those rows too (after the sampling rows), turned into logprobs per request
(``sampler.token_logprobs``). The step's fp32 logits are then up to its token budget
(``max_num_batched_tokens``) by the vocabulary: 2,048 x 49,152 x 4 bytes = 400 MB at most.

Runs on CPU (``dtype`` "auto" by default: bf16 where the CPU computes it fast, else fp32;
``engine.model.dtype_choice``) and, unchanged, on CUDA (``device="cuda"``).

Weights that leave (``offload``, ``ModelConfig.offload_after_s``): an idle model's weights are
dropped from the device and the memory goes back to the system (the KV cache and its prefix
blocks stay); the first step that needs them loads them again from the model's converted
files (``reload``), which the operating system's page cache keeps in host memory while it
has room: host memory, then disk, with no second copy of our own. That step's requests wait
for the load (it is their time to first token), other models of the process do not.
"""

from __future__ import annotations

import functools
import gc
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from interlock import heap
from interlock.deploy import DEFAULT_KV_CACHE_GIB, DEFAULT_MAX_NUM_BATCHED_TOKENS
from interlock.engine.config import EngineConfig
from interlock.engine.constraints import Constraints
from interlock.engine.model import (
    LlamaModel,
    ModelInput,
    PagedKVCache,
    SequenceChunk,
    blocks_for_budget,
    build_input,
    dtype_choice,
)
from interlock.engine.model.config import ModelArchConfig
from interlock.engine.runner import RunnerOutput, ScheduledRequest, SchedulerOutput
from interlock.engine.sampler import Sampler, SamplingRow, token_logprobs
from interlock.engine.shared_cache import SharedCacheView
from interlock.env import get_env
from interlock.errors import ConfigError
from interlock.model_store import footprint, resolve_model
from interlock.protocol.transfer import SharedCacheRegion

log = logging.getLogger(__name__)


class TorchRunner:
    def __init__(
        self,
        model: LlamaModel,
        *,
        num_blocks: int,
        block_size: int = 16,
        seed: int | None = None,
        shared: bool = False,
        folder: Path | None = None,
        reload: Callable[[], LlamaModel] | None = None,
        load_s: float = 0.0,
    ) -> None:
        """``seed``: the sampler's, for unseeded requests (None: fresh randomness, see
        ``engine.sampler``); ``shared``: the KV cache on a memfd (``CacheConfig.shared_kv_cache``);
        ``folder``: the model's, whose tokenizer structured outputs need (None: refused rows);
        ``reload``: loads the model again after ``offload`` (None: its weights never leave);
        ``load_s``: how long the first load took (the estimate of a reload until one is timed)."""
        self._model: LlamaModel | None = model
        self._reload = reload
        self.offloads = 0
        self.reloads = 0
        self.last_reload_s = load_s
        self.device = model.device
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.vocab_size = model.config.vocab_size
        self.eos_token_ids = model.config.eos_token_ids
        self.cache = PagedKVCache(
            model.config, num_blocks, block_size, model.dtype, model.device, shared=shared
        )
        self.fused = model.fused_attention(block_size)
        self.kv_block_nbytes = self.cache.block_nbytes
        self.sampler = Sampler(self.eos_token_ids, seed=seed, device=model.device)
        self.constraints = Constraints(folder, vocab_size=self.vocab_size, eos_token_ids=self.eos_token_ids)

    @property
    def model(self) -> LlamaModel:
        """The model, loaded again first if its weights were offloaded."""
        if self._model is None:
            assert self._reload is not None, "offloaded without a way back"
            t0 = time.perf_counter()
            self._model = self._reload()
            self.last_reload_s = time.perf_counter() - t0
            self.reloads += 1
            log.info("model weights loaded again in %.2f s", self.last_reload_s)
        return self._model

    @property
    def resident(self) -> bool:
        return self._model is not None

    @property
    def weights_load_s(self) -> float:
        """Seconds a request would wait for the weights (``LoadReport.weights_load_s``): 0 while
        they are in, else the last load's time (never under 1 ms: out is never reported as in)."""
        return 0.0 if self._model is not None else max(self.last_reload_s, 1e-3)

    def load_weights(self) -> float:
        """Bring offloaded weights back now (a prefetch); seconds it took, 0 if they were in."""
        if self._model is not None:
            return 0.0
        _ = self.model
        return self.last_reload_s

    @property
    def can_offload(self) -> bool:
        """The weights are in and may leave (a way back to load them is known)."""
        return self._model is not None and self._reload is not None

    def offload(self) -> bool:
        """Drop the weights (True: dropped; False: already gone or they may not leave)."""
        if self._model is None or self._reload is None:
            return False
        self._model = None
        gc.collect()
        heap.trim()  # the point of dropping weights is the memory it frees for other models
        self.offloads += 1
        log.info("model weights offloaded (idle)")
        return True

    @classmethod
    def from_config(cls, config: EngineConfig) -> TorchRunner:
        folder = resolve_model(config.model.model)
        return cls.from_folder(
            folder,
            device=config.model.device,
            dtype=config.model.dtype,
            max_model_len=config.scheduler.max_model_len,
            block_size=config.cache.block_size,
            num_blocks=config.cache.num_blocks,
            kv_cache_gib=config.cache.kv_cache_gib,
            seed=config.model.seed,
            num_threads=config.model.num_threads or get_env().num_threads,
            max_rows=config.scheduler.max_num_batched_tokens,
            shared=config.cache.shared_kv_cache,
        )

    @classmethod
    def from_folder(
        cls,
        folder: Path,
        *,
        device: str = "cpu",
        dtype: str = "auto",
        max_model_len: int = 2048,
        block_size: int = 16,
        num_blocks: int | None = None,
        kv_cache_gib: float = DEFAULT_KV_CACHE_GIB,
        seed: int | None = None,
        num_threads: int = 0,
        max_rows: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
        shared: bool = False,
    ) -> TorchRunner:
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError(f"device {device!r} requested but no CUDA device is available")
        if num_threads > 0:
            torch.set_num_threads(num_threads)
        env = get_env()
        torch_dtype = resolve_dtype(folder, device, dtype)
        load = functools.partial(
            LlamaModel.load,
            folder,
            torch_dtype,
            torch.device(device),
            max_len=max_model_len,
            kernels=env.kernels,
            max_rows=max_rows,
        )
        t0 = time.perf_counter()
        model = load()
        load_s = time.perf_counter() - t0
        footprint.record(folder, dtype, model.weights.nbytes)  # what placement counts next time
        if max_model_len > model.config.max_position_embeddings:
            raise ConfigError(
                f"max_model_len {max_model_len} exceeds the model's "
                f"max_position_embeddings {model.config.max_position_embeddings}"
            )
        if num_blocks is None:
            num_blocks = blocks_for_budget(model.config, block_size, torch_dtype, kv_cache_gib)
        return cls(
            model,
            num_blocks=num_blocks,
            block_size=block_size,
            seed=seed,
            shared=shared,
            folder=folder,
            reload=load,
            load_s=load_s,
        )

    @torch.inference_mode()
    def execute(self, batch: SchedulerOutput) -> RunnerOutput:
        self.constraints.forget(batch.finished_request_ids)
        scheduled = [r for r in batch.scheduled if len(r.token_ids)]
        if not scheduled:
            return RunnerOutput()
        chunks = [SequenceChunk(r.token_ids, r.start_pos, r.block_table) for r in scheduled]
        inputs = build_input(chunks, self.block_size, self.device, fused=self.fused)
        sampling = [i for i, r in enumerate(scheduled) if r.do_sample]
        rows = [inputs.last_rows[i] for i in sampling]
        asking = _prompt_logprob_rows(scheduled, inputs.last_rows)
        for _, prompt_rows in asking:
            rows += prompt_rows
        logits = self._logits(chunks, inputs, rows)
        output = RunnerOutput()
        start = len(sampling)  # prompt rows follow the sampling rows, one request after another
        for request, prompt_rows in asking:
            end = start + len(prompt_rows)
            positions = request.prompt_logprob_positions
            targets = request.prompt_token_ids[positions.start + 1 : positions.stop + 1]
            top_n = request.sampling.prompt_logprobs or 0
            output.prompt_logprobs[request.request_id] = token_logprobs(logits[start:end], targets, top_n)
            start = end
        if not sampling:
            return output
        logits = logits[: len(sampling)]
        requests = [scheduled[i] for i in sampling]
        self.constraints.mask(logits, requests)
        result = self.sampler(
            logits,
            [
                SamplingRow(r.sampling, r.num_output_tokens, r.prompt_token_ids, r.output_token_ids)
                for r in requests
            ],
        )
        self.constraints.accept(requests, result.token_ids)
        for request, token, logprobs in zip(requests, result.token_ids, result.logprobs, strict=True):
            output.sampled[request.request_id] = token
            if logprobs is not None:
                output.logprobs[request.request_id] = logprobs
        return output

    def _logits(self, chunks: Sequence[SequenceChunk], inputs: ModelInput, rows: list[int]) -> torch.Tensor:
        """fp32 logits of the batch's ``rows`` (a group of ranks computes them together)."""
        index = torch.tensor(rows, dtype=torch.long, device=self.device)
        return self.model.forward(inputs.input_ids, inputs.positions, inputs.meta, self.cache, index)

    def close(self) -> None:
        pass

    def export_blocks(self, block_ids: Sequence[int], out: memoryview) -> None:
        self.cache.export_blocks(block_ids, out)

    def import_blocks(self, block_ids: Sequence[int], data: memoryview) -> None:
        self.cache.import_blocks(block_ids, data)

    def import_each(self, block_ids: Sequence[int], blocks: Sequence[memoryview]) -> None:
        self.cache.import_each(block_ids, blocks)

    def shared_region(self) -> SharedCacheRegion | None:
        return self.cache.shared_region()

    def region_mismatch(self, region: SharedCacheRegion) -> str:
        return self.cache.region_mismatch(region)

    def kv_layout(self) -> tuple[int, int, str]:
        return self.cache.layout()

    def copy_from_shared(
        self,
        view: SharedCacheView,
        src_ids: Sequence[int],
        block_ids: Sequence[int],
        part: tuple[int, int] = (0, 1),
    ) -> None:
        self.cache.copy_from_shared(view, src_ids, block_ids, part)


def resolve_dtype(folder: Path, device: str, dtype: str) -> torch.dtype:
    """``dtype`` as a torch dtype (``auto``: measured, ``engine.model.dtype_choice``)."""
    env = get_env()
    choice = dtype_choice.resolve(
        dtype,
        torch.device(device),
        ModelArchConfig.from_folder(folder),
        cache_dir=env.cache_dir,
        fused=env.cpu_kernels,
    )
    log.info("model dtype %s", choice.why)
    return choice.dtype


def _prompt_logprob_rows(
    scheduled: Sequence[ScheduledRequest], last_rows: Sequence[int]
) -> list[tuple[ScheduledRequest, list[int]]]:
    """(request, batch rows of its ``prompt_logprob_positions``) for each request asking for
    prompt logprobs in this step: a chunk's tokens are consecutive rows of the batch."""
    asking = []
    for i, r in enumerate(scheduled):
        if r.prompt_logprob_positions:
            row_of_start = last_rows[i] - len(r.token_ids) + 1 - r.start_pos
            asking.append((r, [row_of_start + p for p in r.prompt_logprob_positions]))
    return asking
