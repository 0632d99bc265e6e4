"""Trace replay and workload simulation in virtual time: traces (Mooncake format, synthetic
shared-prefix workloads), a fast simulated worker, and the replay loop behind a real Router."""

from interlock.sim.bounds import infinite_cache_hit_ratio, pooled_cache_hit_ratio
from interlock.sim.replay import ReplayConfig, replay
from interlock.sim.report import ReplayReport
from interlock.sim.synthetic import SharedPrefixSpec, shared_prefix_requests
from interlock.sim.trace import (
    MooncakeRecord,
    SimRequest,
    TraceHasher,
    load_mooncake,
    mooncake_requests,
)
from interlock.sim.worker import SimWorker

__all__ = [
    "MooncakeRecord",
    "ReplayConfig",
    "ReplayReport",
    "SharedPrefixSpec",
    "SimRequest",
    "SimWorker",
    "TraceHasher",
    "infinite_cache_hit_ratio",
    "load_mooncake",
    "mooncake_requests",
    "pooled_cache_hit_ratio",
    "replay",
    "shared_prefix_requests",
]
