"""KV tiers below the engine's device pool: host memory and disk (see ``manager``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from interlock.engine.block_pool import Evicted
from interlock.engine.config import EngineConfig
from interlock.engine.tiers.deadline import LoadDeadline
from interlock.engine.tiers.disk import DiskTier, layout_digest
from interlock.engine.tiers.host import HostStore, HostTier
from interlock.engine.tiers.io import ManualIO, ThreadIO, TierIO
from interlock.engine.tiers.manager import BlockCopier, KVTiers, LoadDone
from interlock.engine.tiers.shared import SharedHostTier, segment_path

__all__ = [
    "DiskTier",
    "Evicted",
    "HostStore",
    "HostTier",
    "KVTiers",
    "LoadDeadline",
    "LoadDone",
    "ManualIO",
    "SharedHostTier",
    "ThreadIO",
    "TierIO",
    "build_tiers",
]


def build_tiers(
    config: EngineConfig,
    runner: BlockCopier,
    *,
    block_size: int,
    io: TierIO | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> KVTiers | None:
    """The tiers ``config.cache`` asks for, or None; ``clock`` times their load deadlines."""
    cache = config.cache
    if not (cache.has_host_tier or cache.has_disk_tier):
        return None
    nbytes = runner.kv_block_nbytes
    host_blocks = cache.tier_blocks("host", nbytes)
    disk_blocks = cache.tier_blocks("disk", nbytes)
    m = config.model
    layout = f"{m.runner}|{m.model}|{m.dtype}|bs={block_size}|{nbytes}"
    host: HostStore | None = None
    if host_blocks and cache.host_kv_shared is not None:
        host = SharedHostTier(segment_path(cache.host_kv_shared), host_blocks, nbytes, layout_digest(layout))
    elif host_blocks:
        host = HostTier(host_blocks, nbytes)
    io = io if io is not None else ThreadIO()
    disk = None
    if disk_blocks:
        assert cache.disk_kv_path is not None
        disk = DiskTier(Path(cache.disk_kv_path), disk_blocks, nbytes, layout, io)
    deadline = LoadDeadline(cache.tier_load_timeout_s, cache.tier_load_min_mib_s * (1 << 20))
    return KVTiers(runner, io, host=host, disk=disk, deadline=deadline, clock=clock)
