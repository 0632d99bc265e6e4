"""Trace replay and workload simulation in virtual time: traces (Mooncake format via
``interlock.mooncake``, synthetic shared-prefix workloads), a fast simulated worker, and the replay loop behind a real Router."""

from interlock.sim.bounds import infinite_cache_hit_ratio, pooled_cache_hit_ratio
from interlock.sim.replay import ReplayConfig, replay
from interlock.sim.report import ReplayReport
from interlock.sim.synthetic import SharedPrefixSpec, shared_prefix_requests
from interlock.sim.trace import SimRequest, TraceHasher, mooncake_requests
from interlock.sim.worker import SimWorker

__all__ = [
    "ReplayConfig",
    "ReplayReport",
    "SharedPrefixSpec",
    "SimRequest",
    "SimWorker",
    "TraceHasher",
    "infinite_cache_hit_ratio",
    "mooncake_requests",
    "pooled_cache_hit_ratio",
    "replay",
    "shared_prefix_requests",
]
