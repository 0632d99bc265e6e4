"""Build a runner and an engine from an ``EngineConfig`` (the one place that picks runners)."""

from __future__ import annotations

from interlock.engine.clock import Clock, RealClock
from interlock.engine.config import EngineConfig
from interlock.engine.core import EngineCore
from interlock.engine.runner import ModelRunner
from interlock.engine.runners.mock import MockRunner
from interlock.engine.timing import TimingModel
from interlock.errors import ConfigError
from interlock.names import RUNNERS

MOCK_DEFAULT_BLOCKS = 8192
"""Mock pool size when the config leaves ``num_blocks`` unset (its KV is 4 bytes a token)."""


def build_runner(config: EngineConfig, *, clock: Clock | None = None, speedup: float = 1.0) -> ModelRunner:
    """``mock``: a MockRunner that sleeps its modelled step time (divided by ``speedup``) on a
    real clock, or only records it on a ``VirtualClock``; ``torch``: the real model (over a group of rank processes when
    ``tensor_parallel_size x pipeline_parallel_size`` > 1, ``engine.parallel``)."""
    kind = config.model.runner
    if kind == "mock":
        return MockRunner(
            num_blocks=config.cache.num_blocks or MOCK_DEFAULT_BLOCKS,
            block_size=config.cache.block_size,
            timing=TimingModel(speedup=speedup),
            clock=clock or RealClock(),
            shared=config.cache.shared_kv_cache,
        )
    if kind == "torch" and config.model.ranks > 1:
        from interlock.engine.parallel.group import GroupRunner

        return GroupRunner.from_config(config)
    if kind == "torch":
        # Imported here so that the mock path never loads torch.
        from interlock.engine.runners.torch_runner import TorchRunner

        runner: ModelRunner = TorchRunner.from_config(config)
        return runner
    raise ConfigError(f"unknown runner {kind!r} (expected one of {', '.join(RUNNERS)})")


def build_engine(
    config: EngineConfig,
    *,
    clock: Clock | None = None,
    speedup: float = 1.0,
    instance_id: str = "",
    kv_hold_timeout_s: float = 30.0,
) -> EngineCore:
    """``kv_hold_timeout_s``: how long a prefill's KV waits to be staged or pulled before it is
    freed (the worker's ``kv_transfer_timeout_s``)."""
    runner = build_runner(config, clock=clock, speedup=speedup)
    try:
        return EngineCore(
            config, runner, clock=clock, instance_id=instance_id, kv_hold_timeout_s=kv_hold_timeout_s
        )
    except BaseException:
        runner.close()  # a group's rank processes end with it
        raise
