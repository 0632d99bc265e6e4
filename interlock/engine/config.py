"""Engine configuration: typed, frozen, validated once."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from interlock.deploy import (
    DEFAULT_KV_CACHE_GIB,
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_MAX_NUM_SEQS,
    DEFAULT_TIER_LOAD_MIN_MIB_S,
    DEFAULT_TIER_LOAD_TIMEOUT_S,
    offload_refused,
)
from interlock.errors import ConfigError
from interlock.names import DTYPES, ENGINES

_SEGMENT_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,99}")


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16
    num_blocks: int | None = None
    """KV blocks in the pool; None derives it from ``kv_cache_gib`` and the model shape."""
    kv_cache_gib: float = DEFAULT_KV_CACHE_GIB
    enable_prefix_caching: bool = True
    watermark: float = 0.01
    """Fraction of blocks kept free at admission so running requests are rarely preempted."""
    host_kv_gib: float = 0.0
    """Host-memory KV tier below the device pool (``interlock.engine.tiers``); 0: none."""
    host_kv_blocks: int | None = None
    """The host tier's size in blocks instead of ``host_kv_gib``."""
    host_kv_shared: str | None = None
    """Share the host tier with the other workers of this host that give the same name (a
    segment in /dev/shm); None: a private host tier."""
    disk_kv_gib: float = 0.0
    """Disk KV tier below the host tier, files under ``disk_kv_path``; 0: none."""
    disk_kv_blocks: int | None = None
    """The disk tier's size in blocks instead of ``disk_kv_gib``."""
    disk_kv_path: str | None = None
    """Directory of the disk tier (one worker per directory)."""
    shared_kv_cache: bool = False
    """Put the KV cache on a memfd (CPU only) so a decode worker of this host copies a
    prefill's blocks straight out of it (one copy, ``interlock.engine.shared_cache``) instead of
    an export and an import around a staged payload."""
    tier_load_timeout_s: float = DEFAULT_TIER_LOAD_TIMEOUT_S
    """A load from the host or disk tier not done within this, plus its bytes at
    ``tier_load_min_mib_s``, is abandoned: the request computes those blocks instead (a hung
    or dying disk; ``interlock.engine.tiers.deadline``)."""
    tier_load_min_mib_s: float = DEFAULT_TIER_LOAD_MIN_MIB_S
    """The slowest read rate, MiB/s, a working disk is allowed when sizing that deadline (a
    loaded HDD or NFS mount reads faster: the deadline catches hangs, not slow disks)."""

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ConfigError("block_size must be positive")
        if self.num_blocks is not None and self.num_blocks < 2:
            raise ConfigError("num_blocks must be at least 2")
        if not 0.0 <= self.watermark < 1.0:
            raise ConfigError("watermark must be in [0, 1)")
        for tier in ("host", "disk"):
            gib, blocks = getattr(self, f"{tier}_kv_gib"), getattr(self, f"{tier}_kv_blocks")
            if gib < 0:
                raise ConfigError(f"{tier}_kv_gib must be >= 0")
            if blocks is not None and blocks < 1:
                raise ConfigError(f"{tier}_kv_blocks must be positive")
            if blocks is not None and gib:
                raise ConfigError(f"give {tier}_kv_gib or {tier}_kv_blocks, not both")
        for name in ("tier_load_timeout_s", "tier_load_min_mib_s"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ConfigError(f"{name} must be positive and finite")
        if self.has_disk_tier and not self.disk_kv_path:
            raise ConfigError("a disk KV tier (disk_kv_gib) needs disk_kv_path")
        if self.disk_kv_path and not self.has_disk_tier:
            raise ConfigError("disk_kv_path is set but the disk tier has no size (disk_kv_gib)")
        if self.host_kv_shared is not None:
            if not self.has_host_tier:
                raise ConfigError("host_kv_shared needs a host tier (host_kv_gib)")
            if not _SEGMENT_NAME.fullmatch(self.host_kv_shared):
                raise ConfigError(
                    f"host_kv_shared {self.host_kv_shared!r}: use letters, digits, "
                    "'_', '-' and '.' (not first)"
                )
        if (self.has_host_tier or self.has_disk_tier) and not self.enable_prefix_caching:
            raise ConfigError("KV tiers (host_kv_gib, disk_kv_gib) need prefix caching")

    @property
    def has_host_tier(self) -> bool:
        return bool(self.host_kv_gib) or self.host_kv_blocks is not None

    @property
    def has_disk_tier(self) -> bool:
        return bool(self.disk_kv_gib) or self.disk_kv_blocks is not None

    def tier_blocks(self, tier: str, block_nbytes: int) -> int:
        """Blocks of the ``host`` or ``disk`` tier for blocks of ``block_nbytes`` (0: none)."""
        blocks = getattr(self, f"{tier}_kv_blocks")
        if blocks is not None:
            return int(blocks)
        gib = getattr(self, f"{tier}_kv_gib")
        if not gib:
            return 0
        n = int(gib * (1 << 30)) // block_nbytes
        if n < 1:
            raise ConfigError(f"{tier}_kv_gib={gib} holds no block of {block_nbytes} bytes")
        return n


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_model_len: int = 2048
    enable_chunked_prefill: bool = True
    preempt_enabled: bool = False
    """A more important waiting request (``interlock.protocol.generate``: lower ``priority``
    first) may take the blocks or the batch slot of a less important running one, which is
    preempted by recompute. Off: nothing running is preempted for priority."""

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens < 1 or self.max_num_seqs < 1:
            raise ConfigError("max_num_batched_tokens and max_num_seqs must be positive")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ConfigError("without chunked prefill, max_num_batched_tokens must be >= max_model_len")


@dataclass(frozen=True)
class ModelConfig:
    model: str = "smollm2"
    """A local Hugging Face folder, a GGUF file, or a known name ("smollm2")."""
    runner: str = "torch"
    """"torch" or "mock"."""
    device: str = "cpu"
    dtype: str = "auto"
    """``names.DTYPES``; ``auto``: bf16 where this machine computes it fast, else fp32 (measured
    when the model loads, ``engine.model.dtype_choice``)."""
    seed: int | None = None
    """Seeds the randomness of requests without a ``seed`` of their own. None (the default):
    fresh in every process (``os.urandom``), so two workers never give the same "random" reply;
    an int makes a run reproducible. A request's own ``seed`` is reproducible either way."""
    num_threads: int = 0
    """torch intra-op threads; 0 keeps torch's default."""
    engine: str = "interlock"
    """``names.ENGINES``: Interlock's engine (``runner`` says which runner), or ``vllm``."""
    engine_args: tuple[tuple[str, Any], ...] = ()
    """vLLM only: more of vLLM's engine arguments, as vLLM names them (``enforce_eager``)."""
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    """Ranks of one worker's model: ``T x P`` processes (``engine.parallel``); vLLM's own
    parallelism for engine vllm."""
    offload_after_s: float = 0.0
    """Drop the weights after this long without a request; the next request loads them
    again (``runners.torch_runner``; vLLM on CUDA: its sleep mode, ``engine.vllm.sleep``).
    0: they stay."""

    @property
    def ranks(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    def __post_init__(self) -> None:
        if self.tensor_parallel_size < 1 or self.pipeline_parallel_size < 1:
            raise ConfigError("tensor_parallel_size and pipeline_parallel_size must be >= 1")
        if not (0 <= self.offload_after_s < math.inf):
            raise ConfigError("offload_after_s must be >= 0 and finite")
        if self.offload_after_s:
            why = offload_refused(self.engine, self.runner, self.ranks, self.device)
            if why:
                raise ConfigError(f"offload_after_s: {why}")
        if self.ranks > 1 and self.engine == "interlock" and self.runner != "torch":
            raise ConfigError(
                f"tensor/pipeline parallelism runs the real model: runner {self.runner!r} has no ranks"
            )
        if self.engine not in ENGINES:
            raise ConfigError(f"engine {self.engine!r} is not known (one of {', '.join(ENGINES)})")
        if self.engine_args and self.engine != "vllm":
            raise ConfigError("engine_args are vLLM's engine arguments: they need engine vllm")
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype {self.dtype!r} is not supported (one of {', '.join(DTYPES)})")


@dataclass(frozen=True)
class EngineConfig:
    model: ModelConfig = ModelConfig()
    cache: CacheConfig = CacheConfig()
    scheduler: SchedulerConfig = SchedulerConfig()

    def __post_init__(self) -> None:
        if self.model.ranks > 1 and self.model.engine == "interlock":
            c = self.cache
            for name, on in (
                ("shared_kv_cache", c.shared_kv_cache),
                ("host_kv_gib", c.has_host_tier),
                ("disk_kv_gib", c.has_disk_tier),
            ):
                if on:
                    raise ConfigError(
                        f"{name}: a worker of several ranks does not export KV blocks yet "
                        "(its KV is split across the ranks' caches)"
                    )
        if self.cache.shared_kv_cache and self.model.device != "cpu":
            raise ConfigError(f"shared_kv_cache needs the KV cache on the CPU, not on {self.model.device!r}")
