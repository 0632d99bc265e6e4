"""KV tiers below the engine's device pool: host memory and disk (see ``manager``)."""

from __future__ import annotations

from pathlib import Path

from interlock.engine.block_pool import Evicted
from interlock.engine.config import EngineConfig
from interlock.engine.tiers.disk import DiskTier
from interlock.engine.tiers.host import HostTier
from interlock.engine.tiers.io import ManualIO, ThreadIO, TierIO
from interlock.engine.tiers.manager import BlockCopier, KVTiers, LoadDone

__all__ = ["DiskTier", "Evicted", "HostTier", "KVTiers", "LoadDone", "ManualIO", "ThreadIO",
           "TierIO", "build_tiers"]


def build_tiers(config: EngineConfig, runner: BlockCopier, *, block_size: int,
                io: TierIO | None = None) -> KVTiers | None:
    """The tiers ``config.cache`` asks for, or None."""
    cache = config.cache
    if not (cache.has_host_tier or cache.has_disk_tier):
        return None
    nbytes = runner.kv_block_nbytes
    host_blocks = cache.tier_blocks("host", nbytes)
    disk_blocks = cache.tier_blocks("disk", nbytes)
    io = io if io is not None else ThreadIO()
    host = HostTier(host_blocks, nbytes) if host_blocks else None
    disk = None
    if disk_blocks:
        assert cache.disk_kv_path is not None
        m = config.model
        layout = f"{m.runner}|{m.model}|{m.dtype}|bs={block_size}|{nbytes}"
        disk = DiskTier(Path(cache.disk_kv_path), disk_blocks, nbytes, layout, io)
    return KVTiers(runner, io, host=host, disk=disk)
