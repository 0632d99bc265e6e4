"""The OpenAI-compatible HTTP application (aiohttp) and helpers to run it.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models[/{model}]``,
``POST /tokenize`` and ``/detokenize`` and ``GET /version`` (vLLM's), ``GET /health`` (503 while
no model is servable), ``GET /live``, ``GET /metrics``, ``GET /openapi.json`` and the live
``GET /dashboard`` (``dashboard_http``; ``GET /`` from a browser goes there). With API keys configured, every path but the open ones (by default
/health, /live and /metrics) needs ``Authorization: Bearer <key>``.

Every failure becomes an OpenAI-style JSON error with the status its ``interlock.errors`` class
carries (503s with ``Retry-After``), an unknown path or method included; a failure only ever
ends its own request. Every response carries ``x-request-id``: the client's own, echoed, or the
server's. One INFO line per generation request goes to the ``interlock.access`` logger (ids,
status, tokens, time, and the client's ``user``/``safety_identifier``/``metadata``). The handler is
thin: parsing, prompt preparation and output assembly live in pure modules; this file wires them
to the backend and the socket.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import logging
import math
import os
import re
import signal
import ssl
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import msgspec
from aiohttp import web

from interlock.errors import (
    ConfigError,
    InterlockError,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
    RateLimited,
    ServiceError,
    ServiceUnavailable,
    Unauthorized,
)
from interlock.frontend.access import ACCESS, ACCESS_LOG, Access, log_access
from interlock.frontend.assembler import error_from_info
from interlock.frontend.auth import KEY_INDEX, Auth
from interlock.frontend.backend import HEADER_REQUEST_ID, Backend, ModelEntry, RequestContext, header_context
from interlock.frontend.body import BodyRules, read_body
from interlock.frontend.catalog import ModelCatalog
from interlock.frontend.choices import ConstraintCheck, Turn, build_choices
from interlock.frontend.config import FrontendConfig
from interlock.frontend.connections import ConnectionTracker
from interlock.frontend.dashboard_http import DASHBOARD_KEY, add_dashboard
from interlock.frontend.fairness import ConnectionLimits, InFlight
from interlock.frontend.fleet_metrics import fleet_text
from interlock.frontend.generation import BestOf, StreamLimits, collect, stream_sse
from interlock.frontend.limits import (
    KEPT_HEADERS,
    MAX_PRIORITY,
    MIN_PRIORITY,
    check_header_values,
    check_prompt_chars,
)
from interlock.frontend.metrics import FrontendMetrics
from interlock.frontend.openapi import openapi_document
from interlock.frontend.peers import PEER_PREFIX, Peers, PeerSet, own_folder, remove_socket
from interlock.frontend.prepare import generate_request as build_request
from interlock.frontend.prepare import tool_plan
from interlock.frontend.responses import error_body
from interlock.frontend.responses_api import (
    ResponsesFormatter,
    ResponsesRequest,
    ResponseStore,
    input_messages,
    output_messages,
    parse_responses,
    to_chat,
)
from interlock.frontend.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    completion_prompts,
    num_choices,
    parse_chat,
    parse_completion,
    prompt_chars,
)
from interlock.frontend.tokenize import detokenize, parse_detokenize, parse_tokenize, tokenize
from interlock.logctx import REQUEST_ID
from interlock.metrics import CONTENT_TYPE, tracing
from interlock.metrics.merge import merge_processes
from interlock.protocol import GenerateRequest

log = logging.getLogger(__name__)
access_log = logging.getLogger("interlock.access")

HEALTH_WAIT_S = 0.5
"""``/health`` waits up to this long for a served model's tokenizer to load (well inside a
probe's usual 1 s timeout); still loading after it: 503 until the first 200."""
_encode = msgspec.json.Encoder().encode


class Frontend:
    """The handlers, bound to one backend."""

    def __init__(self, backend: Backend, config: FrontendConfig) -> None:
        self.backend = backend
        self.config = config
        self.catalog = ModelCatalog(backend)
        self._was_ready = False
        """``/health`` has said 200 once (readiness at start-up waits for tokenizers)."""
        self.auth = Auth(config.auth)
        self.metrics = FrontendMetrics()
        self.metrics.registry.collect("interlock_prompt_chunks_total", self.catalog.chunk_samples)
        self.metrics.registry.collect("interlock_prompt_cache_tokens", self.catalog.cache_tokens)
        backend_metrics = getattr(backend, "metrics_registry", None)  # a router's figures, if any
        if backend_metrics is not None:
            self.metrics.registry.include(backend_metrics)
        self.created = int(time.time())
        limits = ConnectionLimits(
            config.max_connections, config.max_client_connections, config.reserved_connections
        )
        self.connections = ConnectionTracker(limits, on_shed=lambda reason: self.metrics.shed.inc((reason,)))
        self.in_flight = InFlight(config.max_client_requests)
        self.body_rules = BodyRules(
            config.max_body_bytes, config.body_timeout_s, config.min_body_rate, config.body_grace_s
        )
        self.stream_limits = StreamLimits(config.max_stream_buffer_bytes, config.stream_stall_timeout_s)
        self.kept_headers = frozenset(h.lower() for h in (*KEPT_HEADERS, config.route_key_header))
        self.stored = ResponseStore()
        self.constraints = ConstraintCheck()
        self.peers: Peers | None = None
        """The other frontend processes on this port (``peers``); None: this one alone."""

    async def chat(self, request: web.Request) -> web.StreamResponse:
        if tracing.enabled():
            return await self._traced(request, "chat")
        return await self._guarded(request, "chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        if tracing.enabled():
            return await self._traced(request, "completions")
        return await self._guarded(request, "completions")

    async def responses(self, request: web.Request) -> web.StreamResponse:
        if tracing.enabled():
            return await self._traced(request, "responses")
        return await self._guarded(request, "responses")

    async def stored_response(self, request: web.Request) -> web.Response:
        response_id = request.match_info["response_id"]
        stored = await self._find_stored(response_id)
        if stored is None:
            raise NotFound(
                f"no stored response {response_id!r} (responses are kept in this frontend's memory)"
            )
        if request.method == "DELETE":
            self.stored.delete(response_id)
            if self.peers is not None and _RESPONSE_ID.fullmatch(response_id):
                await self.peers.each("DELETE", f"{PEER_PREFIX}/responses/{response_id}")
            return _json({"id": response_id, "object": "response.deleted", "deleted": True})
        return _json(stored[0])

    async def _find_stored(self, response_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
        """A stored response and its conversation: kept here, else by another frontend process
        on this port (the connection that made it may have landed there)."""
        stored = self.stored.get(response_id)
        if stored is None and self.peers is not None and _RESPONSE_ID.fullmatch(response_id):
            found = await self.peers.first("GET", f"{PEER_PREFIX}/responses/{response_id}")
            if found is not None:
                try:
                    response, conversation = msgspec.json.decode(found, type=tuple[dict[str, Any], list[Any]])
                except (msgspec.DecodeError, msgspec.ValidationError):
                    return None
                stored = (response, conversation)
        return stored

    async def peer_stored(self, request: web.Request) -> web.Response:
        """``/peer/responses/{id}``: a response stored in this process (another process's
        ``_find_stored``), or its deletion."""
        response_id = request.match_info["response_id"]
        if request.method == "DELETE":
            return _json({"deleted": self.stored.delete(response_id)})
        stored = self.stored.get(response_id)
        if stored is None:
            raise web.HTTPNotFound()
        return _json([stored[0], stored[1]])

    async def peer_metrics(self, request: web.Request) -> web.Response:
        """``/peer/metrics``: this process's own figures, for another process's ``/metrics``."""
        return web.Response(body=self.metrics.render(self.config.metric_families).encode())

    async def models(self, request: web.Request) -> web.Response:
        return _json({"object": "list", "data": [self._model_card(e) for e in self.catalog.entries()]})

    async def model(self, request: web.Request) -> web.Response:
        try:
            return _json(self._model_card(self.catalog.find(request.match_info["model"])))
        except InterlockError as exc:
            return error_response(exc)

    def _model_card(self, entry: ModelEntry) -> dict[str, object]:
        return {
            "id": entry.name,
            "object": "model",
            "created": self.created,
            "owned_by": "interlock",
            "max_model_len": entry.context_length,
        }

    async def tokenize(self, request: web.Request) -> web.Response:
        req = parse_tokenize(await self._small_body(request), max_depth=self.config.max_json_depth)
        entry = self.catalog.find(req.model)
        return _json(tokenize(req, await self.catalog.tokenizer(entry), entry.context_length))

    async def detokenize(self, request: web.Request) -> web.Response:
        req = parse_detokenize(await self._small_body(request), max_depth=self.config.max_json_depth)
        return _json(detokenize(req, await self.catalog.tokenizer(self.catalog.find(req.model))))

    async def version(self, request: web.Request) -> web.Response:
        return _json({"version": _version()})

    async def _small_body(self, request: web.Request) -> bytes:
        check_header_values(request.headers.items(), self.kept_headers, self.config.max_header_chars)
        body = await read_body(request, self.body_rules)
        self.connections.body_read(request)
        size = len(body)
        check_prompt_chars(size, self.config.max_prompt_chars, param="prompt")
        return body

    async def health(self, request: web.Request) -> web.Response:
        """Readiness: 200 while every served model has a worker taking requests (``ok``, or
        ``degraded`` with the reasons: a restart, a control-plane outage), else 503. Until the
        first 200, a served model whose tokenizer is still loading counts as not served (a
        load balancer then sends nothing that would wait for it); after, it is ``degraded``
        (a model joining later does not take the frontend out)."""
        entries = self.catalog.entries()
        names = [e.name for e in entries]
        problems, degraded, details = _backend_health(self.backend)
        if not names and not problems:
            problems = ["no model is being served"]
        loading, failed = await self.catalog.warm(entries, wait_s=HEALTH_WAIT_S)
        waits = [f"model {name!r}: its tokenizer is loading" for name in loading]
        degraded += failed
        if self._was_ready:
            degraded += waits
        else:
            problems += waits
        if problems:
            return _json(
                {"status": "unavailable", "models": names, "problems": problems + degraded, **details},
                status=503,
                headers={"Retry-After": "1"},
            )
        self._was_ready = True
        if degraded:
            return _json({"status": "degraded", "models": names, "degraded": degraded, **details})
        return _json({"status": "ok", "models": names, **details})

    async def openapi(self, request: web.Request) -> web.Response:
        return _json(openapi_document(_version()))

    async def live(self, request: web.Request) -> web.Response:
        return _json({"status": "ok"})

    async def metrics_text(self, request: web.Request) -> web.Response:
        """``/metrics``: this frontend's figures and its router's; ``?scope=fleet``: every
        worker's own figures too, labelled ``worker`` (docs/metrics.md)."""
        scope = request.query.get("scope", "frontend")
        if scope not in ("frontend", "fleet"):
            raise InvalidRequest(f"scope: '{scope}' is not one of frontend, fleet")
        text = self.metrics.render(self.config.metric_families)
        if self.peers is not None:  # the other frontend processes on this port, summed in
            answers = await self.peers.each("GET", f"{PEER_PREFIX}/metrics", last=True)
            text = merge_processes([text, *(a.decode("utf-8", "replace") for a in answers if a is not None)])
            silent = [str(i) for i, a in zip(self.peers.set.others(), answers, strict=True) if a is None]
            if silent:
                text += f"# frontend processes not answering: {' '.join(silent)}\n"
        if scope == "fleet":
            targets = getattr(self.backend, "metrics_targets", None)
            text = await fleet_text(text, targets() if targets is not None else ())
        return web.Response(body=text.encode(), headers={"Content-Type": CONTENT_TYPE})

    async def _traced(self, request: web.Request, endpoint: str) -> web.StreamResponse:
        """``_guarded``, in the request's root span (tracing on, ``metrics.tracing``): a child of
        the client's ``traceparent`` header if it sent one."""
        with tracing.span(f"http {endpoint}", parent=request.headers.get("traceparent")) as span:
            resp = await self._guarded(request, endpoint)
            span.set_attributes(_span_attributes(request, resp.status))
            return resp

    async def _guarded(self, request: web.Request, endpoint: str) -> web.StreamResponse:
        status = 499  # stays so if the client leaves and the handler is cancelled
        # Per address, and per API key when one was checked: neither many connections nor many
        # addresses buy one client more requests in flight.
        clients: tuple[object, ...] = (self.connections.client(request),)
        if KEY_INDEX in request:
            clients += (("key", request[KEY_INDEX]),)
        if not self.in_flight.admit(clients):
            self.metrics.shed.inc(("client_requests",))
            self.metrics.requests.inc((endpoint, "429"))
            refusal = RateLimited(
                f"too many requests in flight from this client (address or API key): at most "
                f"{self.in_flight.cap} (max_client_requests); retry when one ends"
            )
            return _unread_closes(request, error_response(refusal))
        self.metrics.in_flight.inc()
        logged = REQUEST_ID.set(None)  # set once the request has its id (a kept-alive task's last)
        try:
            resp = await self._generate(request, endpoint)
            status = resp.status
            return resp
        except InterlockError as exc:
            status = exc.status
            return _unread_closes(request, error_response(exc))
        except ConnectionResetError:  # the connection closed under the handler: nobody to answer
            gone = web.Response(status=499)
            gone.force_close()
            return gone
        except Exception:
            log.exception("unexpected error serving %s", request.path)
            status = 500
            return _unread_closes(request, error_response(ServiceError("internal server error")))
        finally:
            self.in_flight.release(clients)
            self.metrics.in_flight.dec()
            self.metrics.requests.inc((endpoint, str(status)))
            log_access(request, endpoint, status)
            REQUEST_ID.reset(logged)

    async def _generate(self, request: web.Request, endpoint: str) -> web.StreamResponse:
        started = perf_counter()
        check_header_values(request.headers.items(), self.kept_headers, self.config.max_header_chars)
        req, turn = await self._read_request(request, endpoint)
        # The end user the client names (safety_identifier, else user) is held to the same cap
        # of requests in flight as an address or an API key.
        end_user = req.safety_identifier or req.user
        users: tuple[object, ...] = (("user", end_user),) if end_user else ()
        if not self.in_flight.admit(users):
            self.metrics.shed.inc(("client_requests",))
            raise RateLimited(
                f"too many requests in flight for this end user (safety_identifier or user): at most "
                f"{self.in_flight.cap} (max_client_requests); retry when one ends"
            )
        try:
            return await self._serve(request, endpoint, req, turn, started)
        finally:
            self.in_flight.release(users)

    async def _serve(
        self,
        request: web.Request,
        endpoint: str,
        req: ChatCompletionRequest | CompletionRequest,
        turn: Turn | None,
        started: float,
    ) -> web.StreamResponse:
        cfg = self.config
        ctx = self._context(request, endpoint)
        if req.priority is not None:  # the body's priority (vLLM's extension) beats the header
            ctx.priority = req.priority
        if ctx.route_key is None and req.prompt_cache_key:  # OpenAI's cache key: KV affinity
            ctx.route_key = req.prompt_cache_key
        request[ACCESS] = Access(ctx.request_id, req)
        REQUEST_ID.set(ctx.request_id)
        entry = self.catalog.find(req.model)
        self.backend.prefetch(entry.name)  # idle weights load while the prompt is prepared
        tok = await self.catalog.tokenizer(entry)
        prompts: list[str | list[int] | None] = (
            [None] if isinstance(req, ChatCompletionRequest) else list(completion_prompts(req))
        )
        num_prompts = len(prompts)
        n = num_choices(req, num_prompts)
        plan = tool_plan(req, tok, entry.name)
        built = []
        for p, prompt in enumerate(prompts):
            built.append(
                await build_request(
                    req,
                    entry,
                    tok,
                    request_id=ctx.request_id if num_prompts * n == 1 else f"{ctx.request_id}-{p}",
                    priority=ctx.priority,
                    max_prompt_chars=cfg.max_prompt_chars,
                    max_prompt_tokens=cfg.max_prompt_tokens,
                    prompt=prompt,
                    plan=plan,
                )
            )
        await self.constraints.check(tok, built[0][0], req, plan, turn)
        if _best_of(req) is not None:  # ranked by their logprobs, asked for or not
            built = [(_with_logprobs(g), ids) for g, ids in built]
        self.auth.admit_tokens(request, sum(len(ids) for _, ids in built) * n)
        choices = build_choices(
            self.backend, self.metrics, req, ctx, entry.name, tok, built, prompts, n, started, plan, turn
        )
        # The client's own id comes back as it was sent; the server's id is the body's ``id``.
        ctx.response_headers.setdefault(
            HEADER_REQUEST_ID, request.headers.get(HEADER_REQUEST_ID) or ctx.request_id
        )
        request[ACCESS].choices = choices
        try:
            first = await choices.next()
            out = first[1]
            if out.error is not None or out.finish_reason == "error":
                raise error_from_info(out.error)  # still before any byte: give it its status
            if req.stream:
                resp = await stream_sse(request, choices, first, _include_usage(req), self.stream_limits)
            else:
                resp = await collect(choices, first, _best_of(req))
            if turn is not None:
                self._store(turn, choices.gens[0].formatter)
            return resp
        finally:
            await choices.close()
            self.auth.charge_tokens(request, choices.completion_tokens)

    def _store(self, turn: Turn, formatter: object) -> None:
        """A finished response, kept for ``previous_response_id`` unless ``store`` is false."""
        if (
            turn.req.store is False
            or not isinstance(formatter, ResponsesFormatter)
            or formatter.final is None
        ):
            return
        conversation = [*turn.history, *input_messages(turn.req.input), *output_messages(formatter.output)]
        self.stored.put(formatter.final, conversation)

    async def _read_request(
        self, request: web.Request, endpoint: str
    ) -> tuple[ChatCompletionRequest | CompletionRequest, Turn | None]:
        """The parsed body, refused if over a size limit before it costs anything more (a
        Responses request as the chat request it means, and itself)."""
        cfg = self.config
        body = await read_body(request, self.body_rules)
        self.connections.body_read(request)
        turn = None
        if endpoint == "chat":
            req: ChatCompletionRequest | CompletionRequest = parse_chat(body, max_depth=cfg.max_json_depth)
        elif endpoint == "responses":
            turn = await self._turn(parse_responses(body, max_depth=cfg.max_json_depth))
            req = to_chat(turn.req, turn.history)
        else:
            req = parse_completion(body, max_depth=cfg.max_json_depth)
        size, prompt_field = prompt_chars(req)
        check_prompt_chars(size, cfg.max_prompt_chars, param=prompt_field)
        return req, turn

    async def _turn(self, req: ResponsesRequest) -> Turn:
        history: list[dict[str, Any]] = []
        if req.previous_response_id is not None:
            stored = await self._find_stored(req.previous_response_id)
            if stored is None:
                raise NotFound(
                    f"previous response {req.previous_response_id!r} is not stored in this frontend",
                    param="previous_response_id",
                )
            history = stored[1]
        return Turn(req, history)

    def _context(self, request: web.Request, endpoint: str) -> RequestContext:
        # Always the server's own id: a client's x-request-id is only echoed and logged, so two
        # clients (or one retrying) sending the same id never collide inside the system.
        prefix = {"chat": "chatcmpl-", "responses": "resp_"}.get(endpoint, "cmpl-")
        try:
            ctx = header_context(
                request.headers,
                request_id=f"{prefix}{uuid.uuid4().hex}",
                endpoint=endpoint,
                route_key_header=self.config.route_key_header,
            )
        except ValueError:
            ctx = None
        if ctx is None or not MIN_PRIORITY <= ctx.priority <= MAX_PRIORITY:
            raise InvalidRequest(
                f"the x-priority header must be an integer from {MIN_PRIORITY} to {MAX_PRIORITY}",
                param="x-priority",
            )
        return ctx


def build_app(
    backend: Backend, *, config: FrontendConfig | None = None, peers: Peers | None = None
) -> web.Application:
    """The aiohttp application serving ``backend``. Run it with ``handler_cancellation=True`` on
    the AppRunner (as ``serve_frontend`` does) so a client disconnect aborts its request.
    ``peers``: the other frontend processes serving the same port (``peers``)."""
    config = config or FrontendConfig()
    frontend = Frontend(backend, config)
    frontend.peers = peers
    connections = frontend.connections
    app = web.Application(
        client_max_size=config.max_body_bytes,
        middlewares=[
            _request_id_middleware,
            connections.middleware,
            _errors_middleware,
            frontend.auth.middleware,
        ],
    )
    app[FRONTEND_KEY] = frontend
    app[CONNECTIONS_KEY] = connections
    app.add_routes(
        [
            web.post("/v1/chat/completions", frontend.chat),
            web.post("/v1/completions", frontend.completions),
            web.post("/v1/responses", frontend.responses),
            web.get("/v1/responses/{response_id}", frontend.stored_response),
            web.delete("/v1/responses/{response_id}", frontend.stored_response),
            web.get("/v1/models", frontend.models),
            web.get("/v1/models/{model}", frontend.model),
            web.post("/tokenize", frontend.tokenize),
            web.post("/detokenize", frontend.detokenize),
            web.get("/version", frontend.version),
            web.get("/health", frontend.health),
            web.get("/live", frontend.live),
            web.get("/metrics", frontend.metrics_text),
            web.get("/openapi.json", frontend.openapi),
        ]
    )
    add_dashboard(app, frontend.metrics, backend, peers=peers)  # GET /dashboard and its event stream
    app.on_cleanup.append(_flush_access_log)
    return app


async def _flush_access_log(app: web.Application) -> None:
    """The access lines of the last requests, before the frontend stops."""
    ACCESS_LOG.flush()


_RESPONSE_ID = re.compile(r"[A-Za-z0-9_-]{1,256}")
"""A response id another frontend process may be asked for (the ids this one makes are such;
anything else, ``../`` above all, never reaches a peer's private socket)."""

FRONTEND_KEY = web.AppKey("interlock_frontend", Frontend)
CONNECTIONS_KEY = web.AppKey("interlock_connections", ConnectionTracker)


def build_peer_app(app: web.Application, routes: Sequence[web.RouteDef] = ()) -> web.Application:
    """What the other frontend processes on this port ask this one (``peers``), served on its
    private socket only: its own figures, dashboard sample and stream, stored responses, and
    ``routes`` (the planner's traffic reading, added by ``cluster.frontends``)."""
    frontend, dashboard = app[FRONTEND_KEY], app[DASHBOARD_KEY]
    peer = web.Application()
    peer.add_routes(
        [
            web.get(f"{PEER_PREFIX}/metrics", frontend.peer_metrics),
            web.get(f"{PEER_PREFIX}/sample", dashboard.peer_sample),
            web.get(f"{PEER_PREFIX}/dashboard/events", dashboard.stream),
            web.get(f"{PEER_PREFIX}/responses/{{response_id}}", frontend.peer_stored),
            web.delete(f"{PEER_PREFIX}/responses/{{response_id}}", frontend.peer_stored),
            *routes,
        ]
    )
    return peer


@dataclass
class FrontendServer:
    """A running frontend; ``await close()`` to stop it."""

    runner: web.AppRunner
    listener: asyncio.Server
    host: str
    port: int
    scheme: str = "http"
    peer_runner: web.AppRunner | None = None
    """The private socket's server (``peers``), or None."""
    peers: Peers | None = None

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    async def wait_tokenizers(self, stop: asyncio.Event | None = None) -> None:
        """Until the served models' tokenizers are loaded here (or their load failed, which
        ``/health`` reports): what ``/health`` waits for before its first 200, so that a
        "serving" line printed after it is true. Returns early once ``stop`` is set."""
        frontend = self.runner.app[FRONTEND_KEY]
        while stop is None or not stop.is_set():
            loading, _ = await frontend.catalog.warm(frontend.catalog.entries(), wait_s=HEALTH_WAIT_S)
            if not loading:
                return

    async def close(self) -> None:
        self.listener.close()
        if self.peer_runner is not None:
            await self.peer_runner.cleanup()
        await self.runner.cleanup()  # closes the open connections
        await self.listener.wait_closed()
        if self.peers is not None:
            await self.peers.close()
            remove_socket(self.peers.set.socket)


async def serve_frontend(
    backend: Backend,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    config: FrontendConfig | None = None,
    peers: PeerSet | None = None,
    peer_routes: Sequence[web.RouteDef] = (),
) -> FrontendServer:
    """Start serving on ``host:port`` (port 0: an ephemeral port) in the running event loop.
    ``peers``: this is one of several processes serving the port (SO_REUSEPORT), reached by
    the others on its private socket (``peers``), with ``peer_routes`` served there too."""
    config = config or FrontendConfig()
    client = Peers(peers) if peers is not None else None
    app = build_app(backend, config=config, peers=client)
    runner = web.AppRunner(
        app,
        handler_cancellation=config.handler_cancellation,
        access_log=None,
        keepalive_timeout=config.idle_timeout_s,
        # No SO_KEEPALIVE probes (a socket object and two system calls per connection): idle
        # connections are closed after idle_timeout_s, long before the kernel's first probe.
        tcp_keepalive=False,
    )
    await runner.setup()
    assert runner.server is not None
    # Our own listener rather than a TCPSite: its protocol factory enforces the connection cap.
    factory = app[CONNECTIONS_KEY].factory(runner.server)
    ssl_context = _ssl_context(config)
    peer_runner = None
    try:
        if peers is not None:
            if peers.primary and port:
                _refuse_taken(host, port)  # SO_REUSEPORT would share a port already in use
            peer_runner = web.AppRunner(build_peer_app(app, peer_routes), access_log=None)
            await peer_runner.setup()
            own_folder(os.path.dirname(peers.socket))
            remove_socket(peers.socket)  # a dead run's
            await web.UnixSite(peer_runner, peers.socket).start()
        listener = await asyncio.get_running_loop().create_server(
            factory, host, port, backlog=1024, ssl=ssl_context, reuse_port=peers is not None
        )
    except BaseException:
        if peer_runner is not None:
            await peer_runner.cleanup()
        await runner.cleanup()
        if client is not None:
            await client.close()
            remove_socket(client.set.socket)
        raise
    bound_port = listener.sockets[0].getsockname()[1]
    scheme = "https" if ssl_context else "http"
    return FrontendServer(runner, listener, host, bound_port, scheme, peer_runner, client)


def _refuse_taken(host: str, port: int) -> None:
    """Raise the bind's own error if ``host:port`` is in use (a plain bind, no SO_REUSEPORT:
    another server of this user on the port would otherwise share its connections)."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))


def _ssl_context(config: FrontendConfig) -> ssl.SSLContext | None:
    if config.ssl_certfile is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(config.ssl_certfile, config.ssl_keyfile)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the TLS certificate or key: {exc}") from exc
    return context


def run_frontend(
    backend: Backend, host: str = "0.0.0.0", port: int = 8000, *, config: FrontendConfig | None = None
) -> None:
    """Serve on uvloop until SIGINT or SIGTERM (the standalone entry point)."""
    import uvloop

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        server = await serve_frontend(backend, host, port, config=config)
        log.info("frontend listening on %s", server.url)
        try:
            await stop.wait()
        finally:
            await server.close()

    uvloop.run(main())


@web.middleware
async def _request_id_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Every response not yet sent gets ``x-request-id``: the client's, or a new one."""
    resp = await handler(request)
    if not resp.prepared and HEADER_REQUEST_ID not in resp.headers:
        resp.headers[HEADER_REQUEST_ID] = request.headers.get(HEADER_REQUEST_ID) or uuid.uuid4().hex
    return resp


@web.middleware
async def _errors_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Errors raised outside a handler's own guard (authentication, rate limits, an unknown
    path or method, a body over the size cap) as JSON error objects."""
    try:
        return await handler(request)
    except InterlockError as exc:
        return error_response(exc)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        resp = error_response(_http_error(request, exc))
        allow = exc.headers.get("Allow")
        if allow is not None:
            resp.headers["Allow"] = allow
        return resp


def _http_error(request: web.Request, exc: web.HTTPException) -> InterlockError:
    if isinstance(exc, web.HTTPMethodNotAllowed):
        return MethodNotAllowed(f"{request.method} is not allowed on {request.path}")
    if isinstance(exc, web.HTTPNotFound):
        return NotFound(f"no such path: {request.path}")
    error = InvalidRequest(exc.text or exc.reason)
    error.status = exc.status  # keep aiohttp's status (413 and the like)
    return error


def _unread_closes(request: web.Request, resp: web.Response) -> web.Response:
    """``resp``, closing the connection after it if the request's body was left unread (aiohttp
    reads and drops what is still arriving for at most its lingering time, so the client gets
    the response rather than a reset; a lingering connection counts as idle)."""
    if request.can_read_body:
        resp.force_close()
    return resp


def error_response(exc: InterlockError) -> web.Response:
    headers = {}
    if isinstance(exc, (ServiceUnavailable, RateLimited)):
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))
    if isinstance(exc, Unauthorized):
        headers["WWW-Authenticate"] = "Bearer"
    return _json(error_body(exc), status=exc.status, headers=headers)


def _span_attributes(request: web.Request, status: int) -> dict[str, str | int]:
    attrs: dict[str, str | int] = {"http.response.status_code": status}
    access = request.get(ACCESS)
    if access is not None:
        attrs.update(request_id=access.request_id, model=access.req.model)
        if access.choices is not None:
            used = access.choices.usage()
            attrs.update(prompt_tokens=used["prompt_tokens"], completion_tokens=used["completion_tokens"])
    return attrs


def _backend_health(backend: object) -> tuple[list[str], list[str], dict[str, object]]:
    """The backend's optional ``health`` (unavailable), ``degraded`` and ``health_details``
    (see ``Backend``'s docstring)."""
    parts = [getattr(backend, name, None) for name in ("health", "degraded", "health_details")]
    health, degraded, details = (part() if part is not None else None for part in parts)
    return list(health or []), list(degraded or []), dict(details or {})


def _json(payload: object, *, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=_encode(payload), status=status, content_type="application/json", headers=headers
    )


def _version() -> str:
    try:
        return importlib.metadata.version("interlock")
    except importlib.metadata.PackageNotFoundError:
        return "0"


def _best_of(req: ChatCompletionRequest | CompletionRequest) -> BestOf | None:
    if isinstance(req, CompletionRequest) and req.best_of is not None and req.best_of > (req.n or 1):
        return BestOf(keep=req.n or 1, logprobs=req.logprobs is not None)
    return None


def _with_logprobs(request: GenerateRequest) -> GenerateRequest:
    sampling = request.sampling
    logprobs = sampling.logprobs if sampling.logprobs is not None else 0
    return msgspec.structs.replace(request, sampling=msgspec.structs.replace(sampling, logprobs=logprobs))


def _include_usage(req: ChatCompletionRequest | CompletionRequest) -> bool:
    return req.stream_options is not None and req.stream_options.include_usage
