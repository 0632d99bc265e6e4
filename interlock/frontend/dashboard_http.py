"""``GET /dashboard``: a live picture of the cluster for people, served by the frontend itself.

The page is one self-contained file shipped in the package (``static/dashboard.html``: inline CSS
and about a hundred lines of JS drawing its charts on ``<canvas>``; no build step, no CDN, no
library). It opens ``GET /dashboard/events``, a Server-Sent Events stream carrying one JSON
snapshot a second (``dashboard.snapshot``): the frontend's totals and five minutes of per-second
rates and latencies, the backend's ``cluster_view()`` where it has one (the router service:
workers, their load and health, routing decisions by reason; a plain engine backend has none and
the page shows the frontend's figures only) and the newest events of ``interlock.metrics.events``.
A task samples the frontend's counters once a second from startup, whether anyone watches or not,
so a page opened late still shows the last minutes.

API keys: with keys configured, both paths need one like every other path (``auth.py``). A browser
cannot set the ``Authorization`` header when it opens a page or an ``EventSource``, so these two
paths also take the key from a cookie: open ``/dashboard?key=<key>`` once; the key is checked like
a header, and the reply sets it as an ``HttpOnly``, ``SameSite=Strict`` cookie limited to
``/dashboard`` (``Secure`` over TLS; it ends with the browser session) and redirects to
``/dashboard``, so the key leaves the address bar and the history at once and the event stream's
address never carries it. The cookie is accepted on these two read-only paths only, never on the
API. The key is never logged: aiohttp's access log is off and nothing here logs a query string.

``GET /`` from a browser (``Accept`` naming ``text/html``) is redirected here; any other request
to ``/`` gets what it got before (a 404, or a 401 first where keys are configured).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from functools import cache
from importlib import resources

import msgspec
from aiohttp import web

from interlock.frontend.auth import BROWSER_PATHS, DASHBOARD_PAGE, KEY_COOKIE
from interlock.frontend.dashboard import EVENTS_SHOWN, History, Sample, read, snapshot
from interlock.frontend.metrics import FrontendMetrics
from interlock.frontend.peers import PEER_PREFIX, Peers, summed
from interlock.metrics.events import EVENTS, EventLog

EVENTS_PATH = BROWSER_PATHS[1]
INTERVAL_S = 1.0
_encode = msgspec.json.Encoder().encode
_PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
        "connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'"
    ),
}


class Dashboard:
    """The sampler and the two handlers, over a frontend's figures and its backend."""

    def __init__(
        self,
        metrics: FrontendMetrics,
        backend: object,
        *,
        events: EventLog = EVENTS,
        interval_s: float = INTERVAL_S,
        clock: Callable[[], float] = time.time,
        peers: Peers | None = None,
    ) -> None:
        self.metrics = metrics
        self.peers = peers
        """The other frontend processes on this port: the first process's samples add theirs
        up; another's stream is the first one's (``peers``)."""
        self.history = History()
        self.interval_s = interval_s
        self._view: Callable[[], dict[str, object]] | None = getattr(backend, "cluster_view", None)
        self._events = events
        self._clock = clock
        self._closing = asyncio.Event()

    def sample(self) -> None:
        self.history.add(read(self.metrics, self._clock()))

    async def sample_all(self) -> None:
        """One sample of this process and the other frontend processes on its port, summed (a
        process that does not answer is left out of this second)."""
        own = read(self.metrics, self._clock())
        rows = [_figures(own)]
        if self.peers is not None:
            for answer in await self.peers.each("GET", f"{PEER_PREFIX}/sample", last=True):
                with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
                    if answer is not None and len(
                        row := msgspec.json.decode(answer, type=list[float])
                    ) == len(rows[0]):
                        rows.append(row)
        self.history.add(Sample(own.at, *summed(rows)))

    async def peer_sample(self, request: web.Request) -> web.Response:
        """``/peer/sample``: this process's running totals, for the first process's dashboard."""
        return web.Response(body=msgspec.json.encode(_figures(read(self.metrics, self._clock()))))

    def message(self) -> bytes:
        """The snapshot as one SSE message."""
        view = self._view() if self._view is not None else None
        body = snapshot(self.history, view, self._events.recent(EVENTS_SHOWN), self._clock())
        return b"data: " + _encode(body) + b"\n\n"

    async def page(self, request: web.Request) -> web.Response:
        if "key" in request.query:  # checked by Auth already: into a cookie, out of the address
            resp = web.Response(status=303, headers={"Location": DASHBOARD_PAGE, "Cache-Control": "no-store"})
            resp.set_cookie(
                KEY_COOKIE,
                request.query["key"],
                path=DASHBOARD_PAGE,
                httponly=True,
                samesite="Strict",
                secure=request.secure,
            )
            return resp
        return web.Response(body=_page(), content_type="text/html", charset="utf-8", headers=_PAGE_HEADERS)

    async def stream(self, request: web.Request) -> web.StreamResponse:
        if self.peers is not None and not self.peers.set.primary:
            return await self._relay(request)
        resp = web.StreamResponse(headers=_STREAM_HEADERS)
        await resp.prepare(request)
        with contextlib.suppress(ConnectionResetError):
            await resp.write(b"retry: 2000\n\n")
            while not self._closing.is_set():
                await resp.write(self.message())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closing.wait(), self.interval_s)
        return resp

    async def _relay(self, request: web.Request) -> web.StreamResponse:
        """The first frontend process's event stream, passed through (one dashboard whichever
        process the browser's connection landed on)."""
        assert self.peers is not None
        resp = web.StreamResponse(headers=_STREAM_HEADERS)
        await resp.prepare(request)
        closing = asyncio.ensure_future(self._closing.wait())
        relay = asyncio.ensure_future(self.peers.relay(0, f"{PEER_PREFIX}/dashboard/events", resp.write))
        try:
            await asyncio.wait((closing, relay), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (closing, relay):
                task.cancel()
            await asyncio.gather(closing, relay, return_exceptions=True)
        return resp

    async def sampling(self, app: web.Application) -> AsyncIterator[None]:
        """``cleanup_ctx``: a sample a second while the app runs (none in a frontend process
        other than the first: its figures are read by the first)."""
        if self.peers is not None and not self.peers.set.primary:
            yield
            return

        async def loop() -> None:
            while True:
                if self.peers is None:
                    self.sample()
                else:
                    await self.sample_all()
                await asyncio.sleep(self.interval_s)

        task = asyncio.create_task(loop())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def close(self, app: web.Application) -> None:
        """``on_shutdown``: end the open streams, so a page left open never holds up a stop."""
        self._closing.set()


def add_dashboard(
    app: web.Application, metrics: FrontendMetrics, backend: object, *, peers: Peers | None = None
) -> Dashboard:
    """Serve the dashboard's two paths from ``app`` and sample ``metrics`` while it runs."""
    dashboard = Dashboard(metrics, backend, peers=peers)
    app[DASHBOARD_KEY] = dashboard
    app.add_routes(
        [
            web.get(DASHBOARD_PAGE, dashboard.page),
            web.get(EVENTS_PATH, dashboard.stream),
            web.route("*", "/", browser_root),
        ]
    )
    app.cleanup_ctx.append(dashboard.sampling)
    app.on_shutdown.append(dashboard.close)
    return dashboard


async def browser_root(request: web.Request) -> web.StreamResponse:
    """``/``: a browser's ``GET`` goes to the dashboard; anything else is not found, as before
    the dashboard (a route, not a middleware: nothing on the path of other requests)."""
    if request.method in ("GET", "HEAD") and "text/html" in request.headers.get("Accept", ""):
        return web.Response(status=302, headers={"Location": DASHBOARD_PAGE})
    raise web.HTTPNotFound()


DASHBOARD_KEY = web.AppKey("interlock_dashboard", Dashboard)
_STREAM_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-store",
    "X-Accel-Buffering": "no",  # a proxy in front must not hold the messages back
}


def _figures(sample: Sample) -> list[float]:
    """A sample's figures but its time, in field order (``Sample(at, *figures)``)."""
    return list(dataclasses.astuple(sample)[1:])


@cache
def _page() -> bytes:
    return resources.files("interlock.frontend").joinpath("static/dashboard.html").read_bytes()
