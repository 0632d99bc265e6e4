"""Engine configuration: typed, frozen, validated once."""

from __future__ import annotations

from dataclasses import dataclass

from interlock.errors import ConfigError


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16
    num_blocks: int | None = None
    """KV blocks in the pool; None derives it from ``kv_cache_gib`` and the model shape."""
    kv_cache_gib: float = 1.0
    enable_prefix_caching: bool = True
    watermark: float = 0.01
    """Fraction of blocks kept free at admission so running requests are rarely preempted."""

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ConfigError("block_size must be positive")
        if self.num_blocks is not None and self.num_blocks < 2:
            raise ConfigError("num_blocks must be at least 2")
        if not 0.0 <= self.watermark < 1.0:
            raise ConfigError("watermark must be in [0, 1)")


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 64
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
            raise ConfigError(
                "without chunked prefill, max_num_batched_tokens must be >= max_model_len"
            )


@dataclass(frozen=True)
class ModelConfig:
    model: str = "smollm2"
    """A local Hugging Face folder, a GGUF file, or a known name ("smollm2")."""
    runner: str = "torch"
    """"torch" or "mock"."""
    device: str = "cpu"
    dtype: str = "bfloat16"
    seed: int = 0
    num_threads: int = 0
    """torch intra-op threads; 0 keeps torch's default."""


@dataclass(frozen=True)
class EngineConfig:
    model: ModelConfig = ModelConfig()
    cache: CacheConfig = CacheConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
