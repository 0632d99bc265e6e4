"""The reactive policy: grow a pool when its requests queue or its KV cache fills, shrink it
when both are low, with a dead band in between (hysteresis).

Per pool (the workers of one role): ``queue`` is waiting requests per worker (the router's own
admission queue counted towards the pool requests enter first: aggregated, else prefill), and
``kv`` the mean KV usage. Grow when ``queue > queue_high`` or ``kv > kv_high``. Shrink only when
``queue <= queue_low`` and ``kv < kv_low`` and the remaining workers would still be under
``kv_high`` with this one's share. A load hovering at either threshold therefore moves the pool
one way only; reversing takes a real change of load across the whole band.
"""

from __future__ import annotations

from interlock.planner.config import PlannerConfig
from interlock.planner.policy import Want
from interlock.planner.state import Observation, WorkerView


def entry_role(pools: dict[str, list[WorkerView]]) -> str | None:
    """The pool a new request queues for first."""
    for role in ("both", "prefill", "decode"):
        if pools.get(role):
            return role
    return None


class ReactivePolicy:
    def __init__(self, config: PlannerConfig) -> None:
        self.config = config

    def wants(self, obs: Observation, pools: dict[str, list[WorkerView]]) -> list[Want]:
        c = self.config
        out: list[Want] = []
        entry = entry_role(pools)
        for role, workers in pools.items():
            ready = [w for w in workers if w.ready]
            if not ready:
                continue
            n = len(ready)
            waiting = sum(w.num_waiting for w in ready) + (obs.router_queue if role == entry else 0)
            queue = waiting / n
            kv = sum(w.kv_usage for w in ready) / n
            if queue > c.queue_high or kv > c.kv_high:
                why = (f"queue {queue:.2f}/worker > {c.queue_high:g}" if queue > c.queue_high
                       else f"kv usage {kv:.2f} > {c.kv_high:g}")
                out.append(Want(role, +1, max(queue / c.queue_high, kv / c.kv_high), why))
            elif (queue <= c.queue_low and kv < c.kv_low
                  and (n == 1 or kv * n / (n - 1) < c.kv_high)):
                out.append(Want(role, -1, 1.0 - max(kv / c.kv_low, 0.0),
                                f"queue {queue:.2f}/worker <= {c.queue_low:g} and "
                                f"kv usage {kv:.2f} < {c.kv_low:g}"))
        return out
