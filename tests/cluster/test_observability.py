"""What an operator sees of a running fleet (in one process: in-process planes, mock runner):
every catalogued metric is exported by some component and nothing uncatalogued is; workers
serve their own /metrics at the address they advertise and the frontend merges them; one access
line per request names its worker(s), time to first token, finish reason and migrations; the
request id reaches the worker's lines; the planner's decisions carry wall-clock time."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from interlock.cluster.builder import RunningCluster
from interlock.frontend.access import FLUSH_S
from interlock.logctx import RequestIdFilter
from interlock.metrics import CATALOG
from interlock.planner import PlannerConfig, RoleBounds
from interlock.planner.build import build_planner
from tests.cluster.test_builder import running as builder_cluster

MODEL = "SmolLM2-135M-Instruct"


def running(nodes: list[dict[str, Any]]) -> contextlib.AbstractAsyncContextManager[RunningCluster]:
    return builder_cluster(group={"nodes": nodes})


def names(text: str) -> set[str]:
    return {f.name for f in text_string_to_metric_families(text)} | {
        m.group(1) for m in re.finditer(r"^# TYPE (\S+) ", text, re.M)
    }


async def chat(http: httpx.AsyncClient, max_tokens: int = 4) -> httpx.Response:
    r = await http.post(
        "/v1/chat/completions",
        json={"model": MODEL, "max_tokens": max_tokens, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code == 200, r.text
    return r


def test_every_catalogued_metric_is_exported_and_nothing_else() -> None:
    async def main() -> set[str]:
        exported: set[str] = set()
        nodes = [{"gpu_count": 1, "num_blocks": 64, "node_role": r} for r in ("prefill", "decode")]
        async with running(nodes) as c, httpx.AsyncClient(base_url=c.server.url, timeout=30) as http:
            await chat(http)
            exported |= names((await http.get("/metrics", params={"scope": "fleet"})).text)
            config = PlannerConfig(both=RoleBounds(0, 0), prefill=RoleBounds(1, 2), decode=RoleBounds(1, 2))
            planned = await c.run_planner(build_planner(config), status_port=0)
            assert planned.url is not None
            await asyncio.sleep(0.2)
            async with httpx.AsyncClient(timeout=10) as plain:
                exported |= names((await plain.get(planned.url + "/metrics")).text)
        return exported

    exported = asyncio.run(main())
    # prometheus_client's parser names a counter family without its _total
    catalogued = set(CATALOG)
    found = {n for n in catalogued if n in exported or n.removesuffix("_total") in exported}
    assert catalogued - found == set(), "catalogued but not exported"
    uncatalogued = {n for n in exported if n not in catalogued and f"{n}_total" not in catalogued}
    assert uncatalogued == set(), "exported but not in interlock/metrics/catalog.py"


def test_workers_serve_their_own_metrics_and_the_access_line_follows_the_request(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.handler.addFilter(RequestIdFilter())  # as cluster.logs.configure puts on its handler

    async def main() -> tuple[str, str, list[str], str]:
        nodes = [{"gpu_count": 2, "num_blocks": 64}]
        async with running(nodes) as c, httpx.AsyncClient(base_url=c.server.url, timeout=30) as http:
            assert c.service is not None
            targets = c.service.metrics_targets()
            assert len(targets) == 2
            own = await http.get(f"http://{targets[0][1]}/metrics")
            assert own.status_code == 200 and "interlock_engine_requests_total" in own.text
            with caplog.at_level(logging.INFO), caplog.at_level(logging.DEBUG, "interlock.worker.access"):
                r = await chat(http, max_tokens=5)
                await asyncio.sleep(3 * FLUSH_S)  # the access line goes out with its moment's others
            fleet = (await http.get("/metrics", params={"scope": "fleet"})).text
            refused = await http.get("/metrics", params={"scope": "galaxy"})
            assert refused.status_code == 400 and "scope" in refused.text
            return r.headers["x-request-id"], fleet, [w for w, _ in targets], own.text

    request_id, fleet, workers, _ = asyncio.run(main())
    fams = {f.name: f for f in text_string_to_metric_families(fleet)}
    done = [s for s in fams["interlock_engine_requests"].samples if s.value]
    assert {s.labels["worker"] for s in fams["interlock_engine_requests"].samples} <= set(workers)
    assert sum(s.value for s in done) == 1 and done[0].labels["finish_reason"] == "length"
    assert (
        sum(s.value for s in fams["interlock_engine_queue_time_seconds"].samples if s.name.endswith("_count"))
        == 1
    )
    access = [r for r in caplog.records if r.name == "interlock.access"]
    assert len(access) == 1
    line = access[0].getMessage()
    served_by = re.search(r" workers=(\S+) ", line)
    assert served_by is not None and served_by.group(1) in workers
    assert "finish=length" in line and "migrations=0" in line and "completion=5" in line
    ttft = re.search(r" ttft_ms=([0-9.]+) ", line)
    assert ttft is not None and float(ttft.group(1)) >= 0
    assert access[0].request_id == request_id  # type: ignore[attr-defined]
    worker_lines = [r for r in caplog.records if r.name == "interlock.worker.access"]
    assert [r.getMessage().split()[0] for r in worker_lines] == [request_id]
    assert "finish=length" in worker_lines[0].getMessage()
    assert worker_lines[0].request_id == request_id  # type: ignore[attr-defined]
