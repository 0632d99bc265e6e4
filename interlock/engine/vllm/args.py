"""vLLM's engine arguments for one worker: Interlock's configuration mapped onto vLLM's names,
then the user's own vLLM arguments on top (``engine_args``: as vLLM names them, they win).

Pure (but for a fresh seed when none is configured): the names vLLM accepts are given
(``known``), so this is tested without vLLM installed.
Refused by name: an argument vLLM does not have, and those the worker owns (what it needs to
serve behind the seam: the model it registers, the KV events it translates, the stats its load
reports come from, one engine per worker).
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Collection, Iterable
from typing import Any

from interlock.engine.config import EngineConfig
from interlock.errors import ConfigError

OWNED = {
    "model": "the worker's model is --model (the execution group's model)",
    "tokenizer": "the tokenizer is the model folder's (the frontend tokenizes with it)",
    "served_model_name": "the name clients use is --served-model-name (the frontend's)",
    "kv_events_config": "the worker subscribes to vLLM's KV events itself (for the KV router)",
    "disable_log_stats": "the worker's load reports come from vLLM's stats",
    "kv_transfer_config": "disaggregation with vLLM workers is not supported yet (docs/vllm.md)",
    "data_parallel_size": "one vLLM engine per worker: start more workers instead",
    "pipeline_parallel_size": "set it with --pipeline-parallel-size (the group's pipeline_parallel_size)",
    "tensor_parallel_size": "set it with --tensor-parallel-size (the group's tensor_parallel_size)",
    "enable_sleep_mode": "set offload_after_s: the worker puts an idle vLLM to sleep itself",
}

_DTYPE = {
    "auto": "auto",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float32": "float32",
    "fp32": "float32",
    "float16": "float16",
    "fp16": "float16",
}


def fresh_seed() -> int:
    """vLLM needs a seed (its default, 0, gives every worker the same unseeded draws): one from
    the operating system's entropy, below 2**32 (vLLM seeds numpy with it)."""
    return int.from_bytes(os.urandom(4), "little")


def parse_engine_arg(item: str) -> tuple[str, Any]:
    """``KEY=VALUE`` from the command line: the value as JSON when it parses (numbers, true,
    false, null, objects), else the string; ``KEY`` alone is ``True``; ``-`` in keys is ``_``."""
    key, sep, raw = item.partition("=")
    key = key.strip().lstrip("-").replace("-", "_")
    if not key:
        raise ConfigError(f"--engine-arg {item!r}: expected KEY=VALUE (vLLM's engine argument names)")
    if not sep:
        return key, True
    try:
        return key, json.loads(raw)
    except ValueError:
        return key, raw


def normalize(engine_args: Iterable[tuple[str, Any]]) -> tuple[tuple[str, Any], ...]:
    """Keys with ``_`` (vLLM's Python names), each once; a repeated key is refused."""
    out: dict[str, Any] = {}
    for key, value in engine_args:
        k = str(key).replace("-", "_")
        if k in out:
            raise ConfigError(f"engine_args: {k} given twice")
        out[k] = value
    return tuple(out.items())


def vllm_engine_args(config: EngineConfig, known: Collection[str]) -> dict[str, Any]:
    """Keyword arguments of vLLM's ``AsyncEngineArgs`` for ``config``; ``known``: its fields."""
    m, c, s = config.model, config.cache, config.scheduler
    args: dict[str, Any] = {
        "model": m.model,
        "tokenizer": m.model,
        "dtype": _DTYPE[m.dtype],
        "block_size": c.block_size,
        "max_model_len": s.max_model_len,
        "max_num_seqs": s.max_num_seqs,
        "max_num_batched_tokens": s.max_num_batched_tokens,
        "enable_prefix_caching": c.enable_prefix_caching,
        "enable_chunked_prefill": s.enable_chunked_prefill,
        "seed": m.seed if m.seed is not None else fresh_seed(),
        "tensor_parallel_size": m.tensor_parallel_size,
        "pipeline_parallel_size": m.pipeline_parallel_size,
    }
    if m.offload_after_s:  # vLLM's sleep mode (engine.vllm.sleep); CUDA only (ModelConfig)
        args["enable_sleep_mode"] = True
    if c.num_blocks is not None:
        args["num_gpu_blocks_override"] = c.num_blocks
    elif m.device == "cpu":
        # On a GPU vLLM sizes its cache from gpu_memory_utilization (an engine_arg).
        args["kv_cache_memory_bytes"] = int(c.kv_cache_gib * (1 << 30))
    for key, value in normalize(m.engine_args):
        if key in OWNED:
            raise ConfigError(f"engine_args.{key}: not passed to vLLM: {OWNED[key]}")
        if key not in known:
            close = difflib.get_close_matches(key, list(known), n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ConfigError(f"engine_args.{key}: vLLM has no engine argument {key!r}{hint}")
        if key == "num_gpu_blocks_override":
            args.pop("kv_cache_memory_bytes", None)
        if key == "kv_cache_memory_bytes":
            args.pop("num_gpu_blocks_override", None)
        args[key] = value
    return args
