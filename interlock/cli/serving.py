"""What ``serve`` and ``frontend`` share: router settings and the dispatcher's flags.

The router service itself is the frontend's backend (it implements ``frontend.backend.Backend``).
"""

from __future__ import annotations

import argparse

from interlock.deploy import Routing
from interlock.router.dispatcher import DispatchOptions
from interlock.router.facade import RouterConfig


def add_dispatch_args(p: argparse.ArgumentParser) -> None:
    """Flags of the router's dispatcher (retries, migration, stall timeouts)."""
    d = DispatchOptions()
    p.add_argument("--migration-limit", type=int, default=d.migration_limit,
                   help="times a request whose worker fails mid-stream moves to another worker "
                        "(0: off; the client gets the error)")
    p.add_argument("--stall-timeout", type=float, default=d.stall_floor_s,
                   help="seconds without a token (once the first is out) after which a stream "
                        "counts as stalled and migrates; raised on workers with slow steps")


def dispatch_options(a: argparse.Namespace) -> DispatchOptions:
    return DispatchOptions(migration_limit=a.migration_limit, stall_floor_s=a.stall_timeout)


def router_config(
    routing: Routing, *, max_inflight_per_worker: int = 0, chunk_tokens: int = 2048
) -> RouterConfig:
    """``chunk_tokens``: the workers' max_num_batched_tokens (prefill tokens per step)."""
    from interlock.router.cost import CostParams

    return RouterConfig(
        policy=routing.policy,
        cost=CostParams(kv_watermark=routing.kv_usage_watermark, chunk_tokens=chunk_tokens),
        queue_capacity=routing.queue_size,
        max_inflight_per_worker=max_inflight_per_worker,
    )
