"""More frontend processes on one port (``control-plane.frontend_workers``, ``--frontend-workers``).

The process that ``serve`` or ``frontend`` runs is the first (index 0): it holds the planner,
the dashboard and the supervisor. It starts the others as children
(``python -m interlock.cluster.frontend_main INDEX``), each with a ``FrontendLaunch`` on stdin and
its secrets in its environment, like workers; each runs the same builder with no workers and no
planner, binds the same port with SO_REUSEPORT and joins the same planes. Their routers share
state as router replicas do (each ingests the workers' KV events and load reports; dispatch-time
load travels over the event plane), so a prefix computed for a request that reached one process
is routed to its holder from any. Their private sockets (``frontend.peers``) make ``/metrics``,
the dashboard, stored responses and the planner's view one.

Limits are counted per process, so for the port as a whole each is N times its setting: open
connections (``max_connections``, the reserved ones, per client), requests in flight per client,
rate limits per API key, the router's queue (``routing.queue_size``) and the memory kept for
stored responses. The kernel spreads a client's connections over the processes.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
from aiohttp import web

from interlock.cluster.spec import ClusterSpec
from interlock.frontend.peers import PEER_PREFIX, Peers, PeerSet
from interlock.planner.live import RouterServiceView
from interlock.planner.loop import TrafficTotals
from interlock.protocol.events import LoadReport
from interlock.protocol.routing import Completion
from interlock.runtime.config import NatsAuth

TRAFFIC_PATH = f"{PEER_PREFIX}/traffic"


@dataclass(frozen=True)
class FrontendLaunch:
    """What a frontend process other than the first needs besides its secrets."""

    spec: ClusterSpec
    """No workers, no planner, no secrets (those come from the environment)."""
    nats_url: str
    peers: PeerSet
    files: NatsAuth = NatsAuth()
    expect_groups: bool = False
    """Tell its router the deployment's models before their workers register (as the first
    process does when it starts them)."""
    on_demand: bool = False
    """Requests for a model with no worker wait for one (the planner scales from zero)."""

    def encode(self) -> bytes:
        return msgspec.json.encode(self)

    @staticmethod
    def decode(data: bytes) -> FrontendLaunch:
        return msgspec.json.decode(data, type=FrontendLaunch)


def peer_sockets(count: int) -> tuple[str, ...]:
    """Private socket paths for ``count`` processes, in a new folder only this user enters."""
    folder = tempfile.mkdtemp(prefix="interlock-frontends-")
    return tuple(f"{folder}/{i}.sock" for i in range(count))


class TrafficQuery(msgspec.Struct, frozen=True):
    model: str | None = None
    seen: int = 0
    """Finished requests of this process the asker has already read."""
    weights: dict[str, float] = {}
    """Routing weights the planner set (``planner.ramp``), for this process's routers too."""


class TrafficAnswer(msgspec.Struct, frozen=True):
    totals: TrafficTotals
    queued: int
    completed: int
    completions: list[Completion]


def traffic_routes(service: Any) -> list[web.RouteDef]:
    """``POST /peer/traffic`` on a process's private socket: its router's traffic as the
    planner's view reads it (``PeersView``)."""

    async def traffic(request: web.Request) -> web.Response:
        q = msgspec.json.decode(await request.read(), type=TrafficQuery)
        view = RouterServiceView(service, model=q.model)
        for instance_id, weight in q.weights.items():
            view.set_weight(instance_id, weight)
        completed, done = view.completions_since(q.seen)
        answer = TrafficAnswer(view.totals(), view.queued(), completed, done)
        return web.Response(body=msgspec.json.encode(answer), content_type="application/json")

    return [web.post(TRAFFIC_PATH, traffic)]


@dataclass
class _Seen:
    """One other process's traffic as last read: totals kept rising across its restarts."""

    heard: bool = False
    completed: int = 0
    queued: int = 0
    last: TrafficTotals = field(default_factory=TrafficTotals)
    base: TrafficTotals = field(default_factory=TrafficTotals)

    def totals(self) -> TrafficTotals:
        return _add((self.base, self.last))


class PeersView:
    """The planner's ``LoadView`` over every frontend process on the port: this process's router
    (``local``) plus the others' traffic, read once per planner tick (``refresh``); a process
    that does not answer counts with what it said last."""

    def __init__(self, local: RouterServiceView, peers: Peers) -> None:
        self.local = local
        self.peers = peers
        self._seen = {i: _Seen() for i in peers.set.others()}
        self._done: list[Completion] = []
        self._weights: dict[str, float] = {}

    async def refresh(self) -> None:
        # Weights of workers still known (a ramp's last weight, 1, stays until its worker goes).
        self._weights = {w: v for w, v in self._weights.items() if self.local.report(w) is not None}
        weights = dict(self._weights)
        asked = list(self._seen.items())
        answers = await asyncio.gather(
            *(
                self.peers.request(
                    i, "POST", TRAFFIC_PATH, TrafficQuery(self.local.model, seen.completed, weights)
                )
                for i, seen in asked
            )
        )
        for (_, seen), answer in zip(asked, answers, strict=True):
            try:
                a = msgspec.json.decode(answer, type=TrafficAnswer) if answer is not None else None
            except (msgspec.DecodeError, msgspec.ValidationError):
                a = None
            if a is None:
                continue  # silent or confused: its last figures stand
            if not seen.heard:  # its history before the first answer is no one interval's traffic
                seen.heard = True
                seen.base = _add((TrafficTotals(), _negated(a.totals)))
            elif a.totals.requests < seen.last.requests:  # it restarted: its counts began again
                seen.base = seen.totals()
            else:
                self._done += a.completions
            seen.completed, seen.queued, seen.last = a.completed, a.queued, a.totals

    def report(self, instance_id: str) -> LoadReport | None:
        return self.local.report(instance_id)

    def queued(self) -> int:
        return self.local.queued() + sum(s.queued for s in self._seen.values())

    def totals(self) -> TrafficTotals:
        return _add((self.local.totals(), *(s.totals() for s in self._seen.values())))

    def completions(self) -> list[Completion]:
        done, self._done = self._done, []
        return [*self.local.completions(), *done]

    def set_weight(self, instance_id: str, weight: float) -> None:
        self.local.set_weight(instance_id, weight)
        self._weights[instance_id] = weight


def _negated(t: TrafficTotals) -> TrafficTotals:
    return TrafficTotals(-t.requests, -t.prompt_tokens, -t.cached_tokens, -t.output_tokens)


def _add(parts: Sequence[TrafficTotals]) -> TrafficTotals:
    return TrafficTotals(
        requests=sum(p.requests for p in parts),
        prompt_tokens=sum(p.prompt_tokens for p in parts),
        cached_tokens=sum(p.cached_tokens for p in parts),
        output_tokens=sum(p.output_tokens for p in parts),
    )
