"""The planner's status over HTTP: ``GET /planner`` (JSON: policy, what each pool wants, why it
holds, every decision with its reason and wall-clock time) and ``GET /metrics`` (decisions,
replicas per role, process figures; docs/metrics.md). Served by ``interlock.metrics.http``, so
the planner needs no web framework; ``interlock planner status`` reads it.
"""

from __future__ import annotations

import asyncio
import json

from interlock.metrics import Registry
from interlock.metrics.http import metrics_route, serve_http
from interlock.metrics.process import register_process
from interlock.planner.loop import PlannerLoop

PATH = "/planner"
KINDS = ("add", "remove", "switch")


def planner_registry(loop: PlannerLoop) -> Registry:
    reg = Registry()

    def decisions() -> list[tuple[tuple[str, ...], float]]:
        counts: dict[str, int] = {}
        for r in loop.planner.history:
            counts[r.kind] = counts.get(r.kind, 0) + 1
        return [((k,), counts.get(k, 0)) for k in KINDS]

    reg.collect("interlock_planner_decisions_total", decisions)
    reg.collect("interlock_planner_tick_errors_total", lambda: (((), loop.errors),))
    reg.collect("interlock_planner_replicas", lambda: list(loop.replicas.items()))
    register_process(reg, "planner")
    return reg


def prometheus_text(loop: PlannerLoop) -> str:
    return planner_registry(loop).render()


async def serve_status(loop: PlannerLoop, host: str = "127.0.0.1", port: int = 0) -> asyncio.Server:
    routes = {
        PATH: lambda: ("application/json", json.dumps(loop.status()).encode()),
        "/metrics": metrics_route(planner_registry(loop)),
    }
    return await serve_http(routes, host, port)
