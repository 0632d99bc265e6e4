"""Several frontend processes on one port (``cluster.frontends``, ``--frontend-workers``)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import httpx
import msgspec
import pytest

from interlock.cluster.builder import RunningCluster, start_cluster
from interlock.cluster.frontends import FrontendLaunch, PeersView, TrafficAnswer
from interlock.cluster.spec import ClusterSpec, ProcessOptions
from interlock.deploy import parse_deployment
from interlock.errors import ConfigError
from interlock.frontend.app import FRONTEND_KEY
from interlock.frontend.peers import PeerSet
from interlock.planner.loop import TrafficTotals
from interlock.protocol.routing import Completion

MODEL = "SmolLM2-135M-Instruct"
PROMPT = " ".join(f"word{i}" for i in range(120))  # several KV blocks


def spec(frontends: int, **processes: Any) -> ClusterSpec:
    d = parse_deployment(
        {
            "execution-group": {
                "runner": "mock",
                "max_model_len": 1024,
                "nodes": [{"gpu_count": 2, "num_blocks": 256}],
            },
            "control-plane": {"listen_port": 0, "frontend_workers": frontends},
        }
    )
    return ClusterSpec(deployment=d, processes=ProcessOptions(drain_grace_s=1.0, **processes))


async def fresh_connection_post(url: str, path: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    """One request on a connection of its own (the kernel picks the process for each)."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        return await http.post(path, json=body, headers=headers)


def route(r: httpx.Response) -> dict[str, str]:
    """The routing decision the response's ``x-interlock-route`` header states."""
    return dict(part.split("=", 1) for part in r.headers["x-interlock-route"].split("; "))


async def own_requests(c: RunningCluster) -> tuple[float, float]:
    """Requests the first process and the second served, read from each one's own figures."""
    assert c.server is not None and c.server.peers is not None
    child = await c.server.peers.request(1, "GET", "/peer/metrics")
    assert child is not None

    def total(text: str) -> float:
        return sum(
            float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith("interlock_requests_total{")
        )

    first = c.server.runner.app[FRONTEND_KEY].metrics.render()
    return total(first), total(child.decode())


def test_two_processes_serve_one_port_and_share_routing_state() -> None:
    async def main() -> None:
        c = await start_cluster(spec(2))
        try:
            assert await c.wait_ready(timeout_s=60) is None
            url = c.server.url
            body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 2}
            explain = {"x-interlock-explain": "1"}
            first = await fresh_connection_post(url, "/v1/completions", body, **explain)
            assert first.status_code == 200, first.text
            holder = route(first)["worker"]
            await asyncio.sleep(0.5)  # its KV events reach both routers
            decisions = []
            for _ in range(24):
                r = await fresh_connection_post(url, "/v1/completions", body, **explain)
                assert r.status_code == 200, r.text
                decisions.append(route(r))
            mine, theirs = await own_requests(c)
            assert mine >= 1 and theirs >= 1 and mine + theirs == 25, (mine, theirs)  # both served
            # Wherever a request landed, its router knew the prefix and where it is cached.
            assert all(d["worker"] == holder and int(d["overlap"]) > 0 for d in decisions), decisions
            async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                text = (await http.get("/metrics")).text
            served = sum(
                float(x.rsplit(" ", 1)[1])
                for x in text.splitlines()
                if x.startswith("interlock_requests_total{")
            )
            assert served == 25  # /metrics on either process counts both
            # A stored response is found whichever process a later connection reaches.
            made = await fresh_connection_post(
                url, "/v1/responses", {"model": MODEL, "input": "hi", "max_output_tokens": 2}
            )
            assert made.status_code == 200, made.text
            rid = made.json()["id"]
            for _ in range(8):
                async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                    got = await http.get(f"/v1/responses/{rid}")
                assert got.status_code == 200 and got.json()["id"] == rid, got.text
            nxt = await fresh_connection_post(
                url,
                "/v1/responses",
                {"model": MODEL, "input": "more", "previous_response_id": rid, "max_output_tokens": 2},
            )
            assert nxt.status_code == 200, nxt.text
            folder = os.path.dirname(c.server.peers.set.socket)
        finally:
            await c.close()
        assert not os.path.exists(folder)

    asyncio.run(main())


class FakePeers:
    """``frontend.peers.Peers`` as a ``PeersView`` uses it: answers set by the test."""

    def __init__(self) -> None:
        self.set = PeerSet(0, ("a", "b"))
        self.answer: TrafficAnswer | None = None
        self.asked: list[Any] = []

    async def request(self, index: int, method: str, path: str, body: Any = None) -> bytes | None:
        self.asked.append(body)
        return None if self.answer is None else msgspec.json.encode(self.answer)


class LocalView:
    model = None

    def __init__(self) -> None:
        self.weights: dict[str, float] = {}

    def report(self, instance_id: str) -> object:
        return object()

    def queued(self) -> int:
        return 1

    def totals(self) -> TrafficTotals:
        return TrafficTotals(requests=10, prompt_tokens=100)

    def completions(self) -> list[Completion]:
        return []

    def set_weight(self, instance_id: str, weight: float) -> None:
        self.weights[instance_id] = weight


def test_the_planners_view_adds_the_other_processes_traffic_across_their_restarts() -> None:
    done = Completion(0.0, 0.1, 0.2, 3, 10, 0, MODEL)
    peers = FakePeers()
    view = PeersView(LocalView(), peers)  # type: ignore[arg-type]

    async def main() -> None:
        # Its first answer is where its counting starts: its history is no one interval's traffic.
        peers.answer = TrafficAnswer(TrafficTotals(requests=5, prompt_tokens=50), 2, 1, [done])
        view.set_weight("w1", 0.5)
        await view.refresh()
        assert view.totals().requests == 10 and view.queued() == 3 and view.completions() == []
        assert peers.asked[-1].weights == {"w1": 0.5} and peers.asked[-1].seen == 0
        peers.answer = TrafficAnswer(TrafficTotals(requests=7, prompt_tokens=70), 0, 2, [done])
        await view.refresh()
        assert peers.asked[-1].seen == 1
        assert view.totals().requests == 12 and view.completions() == [done] and view.completions() == []
        peers.answer = TrafficAnswer(TrafficTotals(requests=2, prompt_tokens=20), 0, 0, [])  # it restarted
        await view.refresh()
        assert view.totals().requests == 14 and view.totals().prompt_tokens == 140  # never backwards
        peers.answer = None  # silent: its last figures stand
        await view.refresh()
        assert view.totals().requests == 14 and view.queued() == 1

    asyncio.run(main())


def test_a_launch_round_trips_and_more_frontends_need_nats_planes() -> None:
    s = spec(3)
    launch = FrontendLaunch(s, "nats://127.0.0.1:4222", PeerSet(2, ("x", "y", "z")), expect_groups=True)
    assert FrontendLaunch.decode(launch.encode()) == launch
    with pytest.raises(ConfigError, match="frontend_workers"):
        spec(2, in_process=True)
    with pytest.raises(ConfigError, match="frontend_workers: 0 is not within"):
        spec(0)
