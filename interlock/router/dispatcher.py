"""One owner for a request's life: route, stream, retry, migrate, finish — for every path.

A request is served in *legs*: one leg is one stream from one worker. The first leg goes where
the router decides (for a disaggregated request, ``DisaggFlow.prepare`` first runs the prefill
leg and hands over the decode leg). When a leg breaks, the dispatcher starts another:

* before the client got any token, the same request is routed again (``max_attempts`` workers
  in all): nothing was sent, so nothing has to be stitched;
* after it, the request *migrates* (``migration_limit`` times at most; 0 turns it off): the
  prompt plus every token already sent goes to another worker as ``resume_token_ids``, routed
  KV-aware on prompt + tokens, so a worker holding that prefix is preferred. The new worker
  recomputes that KV and continues as if it had generated those tokens itself (same seeded
  draws, same token budget), and streams only what comes after them. The client's stream
  continues: same id, no gap in tokens or logprobs, stop strings still matched by the frontend
  across the seam, usage counted once.

Usage: a request's cached prompt tokens (``GenerateOutput.num_cached_tokens``, the client's
``usage.prompt_tokens_details.cached_tokens``) are the prefix-cache hit of the worker that
computed its prompt and first token, and every later leg's chunks carry that same figure. A
disaggregated decode worker imported the whole prompt's KV (its engine counts every prompt
token as cached), and a migrated leg recomputes KV the client was already served: neither is
a cache hit the request got.

A leg breaks when its stream fails (connection lost, a peer silent past the request plane's
``peer_timeout``), when its worker's lease runs out in discovery (a worker that unregisters
itself is draining: its legs run on), when the worker ends it with ``abort`` (a drain's grace
over, shutdown: the client did not ask) or with a service error, or when no token arrives
for longer than the stall timeout: ``max(stall_floor_s, stall_steps x the worker's last decode
step time)`` once the first token is out (a hung or SIGSTOPped engine; before the first token a
queue or a long prefill is no sign of a fault, so only ``first_token_timeout_s`` applies, off by
default). Each break counts against the worker's circuit breaker (``router.breaker``).

A request for an on-demand model with no eligible worker when it arrives (a pool scaled to
zero) waits for one before its first leg (``queue_timeout_s`` at most, then ``NoWorkers``), and
so does one queued at such a model's router when its last worker left meanwhile: the service
counts them for the planner, which starts a worker (``RouterService.router_when_ready``).

Legs are interrupted by cancelling the wait for the next chunk: one lazily re-armed timer per leg
(``_Watch``) fires for a stall, and ``worker_left`` fires it at once; no task or queue per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import msgspec

from interlock.deploy import Routing
from interlock.errors import (
    InterlockError,
    NoWorkers,
    ServiceError,
    TransportError,
    WorkerFailed,
)
from interlock.metrics import Registry, tracing
from interlock.metrics.events import EVENTS
from interlock.protocol import GenerateOutput, GenerateRequest, packed_ids
from interlock.protocol.generate import encode_request
from interlock.protocol.routing import Completion, RequestContext
from interlock.router.admission import Pending, RequestMeta
from interlock.router.breaker import Breakers
from interlock.router.decision import Decision
from interlock.router.directory import Leg, PrefillFlow, WorkerDirectory
from interlock.router.model_router import Router

log = logging.getLogger(__name__)

_decode_output = msgspec.msgpack.Decoder(GenerateOutput).decode

EXPLAIN_HEADER = "x-interlock-route"


@dataclass(frozen=True)
class DispatchOptions:
    max_attempts: int = 3
    """Workers tried for a request that fails before its first token."""
    migration_limit: int = Routing.migration_limit
    """Migrations per request once tokens were sent (0: a broken stream fails the request)."""
    queue_timeout_s: float = 30.0
    """How long a queued request waits for a worker before a 503."""
    stall_floor_s: float = Routing.stall_timeout_s
    stall_steps: float = 50.0
    """Stall timeout after the first token: max(stall_floor_s, stall_steps x decode step time)."""
    first_token_timeout_s: float | None = None
    """Stall timeout before the first token (None: none; transport liveness still applies)."""

    def __post_init__(self) -> None:
        from interlock.errors import ConfigError

        if self.max_attempts < 1:
            raise ConfigError("max_attempts must be at least 1", param="max_attempts")
        if self.migration_limit < 0:
            raise ConfigError("migration_limit must be >= 0", param="migration_limit")
        if self.stall_floor_s <= 0 or self.stall_steps <= 0:
            raise ConfigError("stall timeouts must be positive", param="stall_floor_s")


RECENT_COMPLETIONS = 4096
"""How many finished requests ``DispatchMetrics.recent`` keeps."""


@dataclass
class DispatchMetrics:
    retries: int = 0
    """Requests routed again after a failure before their first token."""
    migrations: int = 0
    migrations_exhausted: int = 0
    stalls: int = 0
    worker_aborts: int = 0
    recovery_s_total: float = 0.0
    """Seconds from each break to the client's next token, summed over migrations."""
    completed: int = 0
    """Requests that finished normally (every leg together)."""
    recent: deque[Completion] = field(default_factory=lambda: deque(maxlen=RECENT_COMPLETIONS))
    """The last ``RECENT_COMPLETIONS`` of them (a reader keeps its own count of ``completed``)."""

    def complete(self, c: Completion) -> None:
        self.completed += 1
        self.recent.append(c)


class LegBroken(TransportError):
    """A leg ended without finishing its request, through no fault of the request."""


class PoolEmptied(NoWorkers):
    """The last worker of the request's on-demand model left while the request waited in its
    router's queue: a request at its first leg waits for a new worker (``Dispatcher._first_leg``)."""


@dataclass(slots=True, eq=False)
class _Watch:
    """One live leg's stall timer, and what lets ``worker_left`` break it while it waits for a
    chunk. One timer per leg, re-armed lazily: a chunk only moves the deadline, and the timer,
    when it fires early, sleeps again until the deadline (``asyncio.timeout`` around each wait
    cost a timer scheduled and cancelled per token: 0.64 → 0.58 ms of frontend CPU a streamed
    request without it)."""

    worker_id: str
    broken: InterlockError | None = None
    deadline: float = math.inf
    """Loop time by which the awaited chunk must come (inf: none)."""
    waiting: asyncio.Task[Any] | None = None
    """The task waiting for a chunk now; None between chunks."""
    expired: bool = False
    _ours: bool = False
    _cancelling: int = 0
    _handle: asyncio.TimerHandle | None = None
    _armed_at: float = math.inf

    def wait(self, deadline: float) -> None:
        """Before waiting for a chunk: the current task is cancelled at ``deadline``."""
        task = asyncio.current_task()
        assert task is not None
        self.deadline, self.waiting, self.expired = deadline, task, False
        self._cancelling = task.cancelling()
        if deadline < self._armed_at:
            self._arm(deadline)

    def waited(self) -> bool:
        """After the wait, however it ended (called again, it answers the same): whether the
        timer cancelled it. Its own cancel is taken back from the task once, as
        ``asyncio.timeout`` does, even when the wait ended some other way meanwhile."""
        if self.waiting is None:
            return self._ours
        self.waiting = None
        task = asyncio.current_task()
        self._ours = self.expired and task is not None and task.uncancel() <= self._cancelling
        return self._ours

    def break_(self, exc: InterlockError) -> None:
        self.broken = exc
        self.deadline = -math.inf
        self.close()
        self._fire()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _arm(self, when: float) -> None:
        self.close()
        self._handle = asyncio.get_running_loop().call_at(when, self._fire)
        self._armed_at = when

    def _fire(self) -> None:
        self._handle, self._armed_at = None, math.inf
        task = self.waiting
        if task is None or self.expired:
            return  # not waiting: the next wait arms it again
        if self.deadline <= asyncio.get_running_loop().time():
            self.expired = True
            task.cancel()
        elif self.deadline < math.inf:
            self._arm(self.deadline)


@dataclass(slots=True)
class _Life:
    """One request's progress across its legs (what the client has, and what it cost)."""

    request: GenerateRequest
    meta: RequestMeta
    hashes: list[int]
    role: str | None
    """``decode`` on the disaggregated path: every later leg routes to a decode worker."""
    arrived: float
    tokens: list[int] = field(default_factory=list)
    """Every token the client was sent."""
    broke_at: float = 0.0
    """When the current break happened (0: streaming normally)."""
    first_at: float | None = None
    cached: int | None = None
    """The prompt's cache hit where it was computed: every leg's chunks report it."""
    attempts: int = 0
    migrations: int = 0


class Dispatcher:
    def __init__(
        self,
        directory: WorkerDirectory,
        options: DispatchOptions = DispatchOptions(),
        breakers: Breakers | None = None,
    ) -> None:
        self.svc = directory
        self.disagg: PrefillFlow | None = None
        """The disaggregated flow, when the owner has one (it sets this after building both)."""
        self.options = options
        self.breakers = breakers or Breakers()
        self.metrics = DispatchMetrics()
        self._waiters: dict[str, asyncio.Future[Decision]] = {}
        self._probes: dict[str, str] = {}
        """Request id -> the worker it probes (until the request finishes)."""
        self._watches: dict[str, set[_Watch]] = {}

    # ---- the request's life ----
    async def generate(
        self, router: Router | None, request: GenerateRequest, ctx: RequestContext | None
    ) -> AsyncIterator[GenerateOutput]:
        """The request's whole life: its first leg (through the disaggregated flow when that is
        active), then leg after leg until one finishes; a leg that breaks is retried before any
        output and migrated after (``_next_leg``). ``router``: the model's router; None: the
        model is served on demand and has no eligible worker now (the request waits for one)."""
        life = _Life(_packed(request), _meta(request, ctx), [], None, time.monotonic())
        router, first, leg = await self._first_leg(router, life)
        _explain(ctx, leg)
        if first is not None:  # the prefill worker's first token
            life.tokens += first.token_ids
            life.first_at = time.monotonic() if first.token_ids else None
            life.cached = first.num_cached_tokens
            try:
                yield first
            except BaseException:  # closed before the decode leg started: release what it holds
                if leg is not None:
                    self._release_unstarted(router, leg)
                raise
        while leg is not None:
            if ctx is not None:
                ctx.workers.append(leg.decision.worker_id)
                ctx.migrations = life.migrations
            try:
                async for out in self._leg(router, leg):
                    yield self._passed_on(life, out)
                self._completed(life, leg)
                return
            except ServiceError as exc:  # LegBroken too; a RequestError is the client's
                self._worker_failed(router, leg.decision.worker_id, exc)
                router, leg = await self._next_leg(router, life, leg, exc)
                if not life.tokens and not leg.skip_first:
                    _explain(ctx, leg)  # nothing sent yet: name the new worker

    async def _first_leg(
        self, router: Router | None, life: _Life
    ) -> tuple[Router, GenerateOutput | None, Leg | None]:
        """(the router that routed it, the prefill's first output or None, the leg to stream;
        None if the request already finished at its first token). With ``router`` None (an
        on-demand model with no eligible worker), or when such a model's last worker left while
        the request waited in the queue (``PoolEmptied``), the request waits for a worker first:
        nothing was sent, so an empty pool is a wait, not a failure."""
        model = life.request.model
        while True:
            if router is None:
                router = await self._worker_for(model)
            life.hashes = router.block_hashes(life.request.token_ids)
            disagg = self.disagg
            if disagg is not None and disagg.active(router, life.request):
                life.role = "decode"
                first, leg = await disagg.prepare(router, life.request, life.meta, life.hashes)
                return router, first, leg
            try:
                routed = Leg(await self.route(router, life.meta, life.hashes), life.request)
            except PoolEmptied:
                router = None
                continue
            router.metrics.record_request(life.meta.prompt_tokens, routed.decision.cached_tokens)
            return router, None, routed

    async def _worker_for(self, model: str) -> Router:
        """The model's router once it has an eligible worker, for a request at its first leg
        (refused with ``Overloaded`` past the service's bound on such waits)."""
        timeout = self.options.queue_timeout_s
        ready = await self.svc.router_when_ready(model, timeout, arriving=True)
        if ready is None:
            raise NoWorkers(
                f"no worker is serving '{model}': none came within {timeout:g} s (queue_timeout_s)",
                retry_after=1.0,
            )
        return ready

    def _passed_on(self, life: _Life, out: GenerateOutput) -> GenerateOutput:
        """``out`` as the client gets it (every leg reports the first leg's cache hit), after
        noting what it tells of the request's progress."""
        if life.broke_at:
            self.metrics.recovery_s_total += time.monotonic() - life.broke_at
            life.broke_at = 0.0
        if life.first_at is None and out.token_ids:
            life.first_at = time.monotonic()
        if life.cached is None:
            if out.token_ids or out.finished:
                life.cached = out.num_cached_tokens
        elif out.num_cached_tokens != life.cached:
            out = msgspec.structs.replace(out, num_cached_tokens=life.cached)
        life.tokens += out.token_ids
        return out

    def _completed(self, life: _Life, leg: Leg) -> None:
        done = time.monotonic()
        first_at = life.first_at or done
        cached = leg.decision.cached_tokens if life.cached is None else life.cached
        self.metrics.complete(
            Completion(
                life.arrived,
                first_at - life.arrived,
                done - first_at,
                len(life.tokens),
                life.meta.prompt_tokens,
                cached,
                life.request.model,
            )
        )

    async def _next_leg(self, router: Router, life: _Life, leg: Leg, exc: ServiceError) -> tuple[Router, Leg]:
        """Where the request goes after ``leg`` broke: another worker before any output
        (``max_attempts``), a migration after (``migration_limit``); else ``exc`` (or
        ``WorkerFailed``) is raised."""
        broken = leg.decision.worker_id
        if not life.tokens and not leg.skip_first:
            life.attempts += 1
            if life.attempts >= self.options.max_attempts:
                raise exc
            self.metrics.retries += 1
            log.warning(
                "worker %s failed before output (%s): routing %s again",
                broken,
                exc.message,
                life.meta.request_id,
            )
            router = await self._router_again(router, life.request.model)
            retry_meta = replace(life.meta, role=life.role, worker_id=None)
            decision = await self.route(router, retry_meta, life.hashes)
            return router, Leg(decision, leg.request, held_tokens=leg.held_tokens)
        if life.migrations >= self.options.migration_limit:
            self.metrics.migrations_exhausted += 1
            if self.options.migration_limit == 0:
                raise exc
            raise WorkerFailed(
                f"the request's worker failed {life.migrations + 1} times; giving up "
                f"(migration limit {self.options.migration_limit})"
            ) from exc
        life.migrations += 1
        life.broke_at = life.broke_at or time.monotonic()
        router = await self._router_again(router, life.request.model)
        leg = await self._migrate(router, life.request, life.meta, life.role, life.tokens, life.migrations)
        self.metrics.migrations += 1
        EVENTS.record(
            "migration", life.meta.request_id, f"{broken} -> {leg.decision.worker_id}: {exc.message}"
        )
        log.warning(
            "migrating request %s from worker %s to %s after %d tokens (%s)",
            life.meta.request_id,
            broken,
            leg.decision.worker_id,
            len(life.tokens),
            exc.message,
        )
        return router, leg

    async def _router_again(self, router: Router, model: str) -> Router:
        """The router to route the next leg with, once some worker can take it (the router
        object is replaced if every worker left in between); NoWorkers after the queue timeout."""
        ready = await self.svc.router_when_ready(model, self.options.queue_timeout_s)
        if ready is None:
            raise NoWorkers(f"no worker is serving '{model}' right now", retry_after=1.0)
        return ready

    def _release_unstarted(self, router: Router, leg: Leg) -> None:
        disagg = self.disagg
        if leg.held_tokens and disagg is not None:
            disagg.release(leg.decision.worker_id, leg.held_tokens)
        self.finish(router, leg.decision.request_id)

    async def _migrate(
        self,
        router: Router,
        request: GenerateRequest,
        meta: RequestMeta,
        role: str | None,
        tokens: Sequence[int],
        n: int,
    ) -> Leg:
        cont = msgspec.structs.replace(
            request, request_id=f"{request.request_id}~{n}", kv_transfer=None, resume_token_ids=tuple(tokens)
        )
        all_ids = (*request.token_ids, *tokens)
        cmeta = replace(
            meta,
            request_id=cont.request_id,
            prompt_tokens=len(all_ids),
            max_tokens=max(request.sampling.max_tokens - len(tokens), 1),
            role=role,
            worker_id=None,
        )
        return Leg(await self.route(router, cmeta, router.block_hashes(all_ids)), cont)

    # ---- one leg ----
    async def _leg(self, router: Router, leg: Leg) -> AsyncIterator[GenerateOutput]:
        """Stream one leg to its end; raise ``LegBroken`` (or the plane's error) if it breaks."""
        d = leg.decision
        disagg = self.disagg
        held = leg.held_tokens
        watch = _Watch(d.worker_id)
        self._watches.setdefault(d.worker_id, set()).add(watch)
        try:
            info = self.svc.instance(d.worker_id)
            if info is None:
                raise LegBroken(f"worker {d.worker_id} left")
            request = leg.request
            ids = packed_ids.for_peer(request.token_ids, info.metadata)
            if ids is not request.token_ids:  # an older worker: the ids as a msgpack array
                request = msgspec.structs.replace(request, token_ids=ids)
            if tracing.enabled():  # the worker's spans join the request's trace
                request = msgspec.structs.replace(request, traceparent=tracing.traceparent())
            stream = self.svc.requests.stream(info.address, encode_request(request))
            first = True
            skip = leg.skip_first
            async with contextlib.aclosing(stream):
                it = aiter(stream)
                while True:
                    chunk = await self._next(it, watch, d.worker_id, first)
                    out = _decode_output(chunk)
                    if out.finish_reason == "abort" or (out.error is not None and out.error.status >= 500):
                        if out.finish_reason == "abort":
                            self.metrics.worker_aborts += 1
                        raise LegBroken(
                            f"worker {d.worker_id} ended the request "
                            f"({out.error.message if out.error else 'aborted'})"
                        )
                    if skip and out.token_ids:
                        skip = False
                        out = _drop_first_token(out)
                    if first and (out.token_ids or out.finished):
                        first = False
                        if held and disagg is not None:
                            held = disagg.release(d.worker_id, held)
                        router.on_first_token(d.request_id)
                        self.svc.share(router)
                        if self.breakers.success(d.worker_id):
                            router.set_blocked(d.worker_id, False)
                            log.info("worker %s passed its probe: routed again", d.worker_id)
                    yield out
                    if out.finished:
                        return
        finally:
            watch.close()
            self._watches[d.worker_id].discard(watch)
            if not self._watches[d.worker_id]:
                del self._watches[d.worker_id]
            if held and disagg is not None:
                disagg.release(d.worker_id, held)
            self.finish(router, d.request_id)

    async def _next(self, it: AsyncIterator[bytes], watch: _Watch, worker_id: str, first: bool) -> bytes:
        if watch.broken is not None:
            raise LegBroken(watch.broken.message)
        limit = self._stall_timeout(worker_id, first)
        watch.wait(math.inf if limit is None else asyncio.get_running_loop().time() + limit)
        try:
            return await anext(it)
        except asyncio.CancelledError:
            if not watch.waited():
                raise  # cancelled from outside (the client left): not a stall
            if watch.broken is not None:
                raise LegBroken(watch.broken.message) from None
            self.metrics.stalls += 1
            raise LegBroken(f"worker {worker_id} sent nothing for {limit:.1f} s") from None
        except StopAsyncIteration:
            raise LegBroken(f"worker {worker_id} ended the stream without a finish") from None
        finally:
            watch.waited()  # the timer's cancel taken back however the wait ended

    def _stall_timeout(self, worker_id: str, first: bool) -> float | None:
        o = self.options
        if first:
            return o.first_token_timeout_s
        report = self.svc.report(worker_id)
        step = report.decode_step_s if report is not None else 0.0
        return max(o.stall_floor_s, o.stall_steps * step)

    def _worker_failed(self, router: Router, worker_id: str, exc: InterlockError) -> None:
        if worker_id not in router.workers():
            return  # it left (a drain whose grace ran out, or a death): no breaker to keep
        router.set_health(worker_id, False)  # until its next load report or health check
        if self.breakers.failure(worker_id, time.monotonic()):
            router.set_blocked(worker_id, True)
            log.warning(
                "worker %s: circuit breaker open for %.1f s after repeated failures (%s)",
                worker_id,
                self.breakers.cooldown_s(worker_id),
                exc.message,
            )

    def worker_left(self, worker_id: str, *, graceful: bool = False) -> None:
        """A worker left discovery. Gone (its lease ran out, or a restart replaced it): break
        every leg streaming from it. ``graceful`` (it unregistered itself: a drain or a role
        change): its legs stream on to their end, as a draining worker finishes what it has; if
        it aborts them when its grace is over, or dies meanwhile, they break and migrate then."""
        if not graceful:
            for watch in list(self._watches.get(worker_id, ())):
                watch.break_(LegBroken(f"worker {worker_id} left"))
        self.breakers.forget(worker_id)

    def tick(self, router_of: dict[str, Router]) -> None:
        """Half-open breakers whose cool-down ended (called about once a second)."""
        for wid in self.breakers.tick(time.monotonic()):
            router = router_of.get(wid)
            if router is not None:
                router.set_blocked(wid, False)
                log.info("worker %s: cool-down over, next request is its probe", wid)

    # ---- routing (also used by the disaggregated flow) ----
    def route(self, router: Router, meta: RequestMeta, hashes: list[int]) -> Awaitable[Decision]:
        """``_route``, in a ``route`` span when tracing is on (``metrics.tracing``); off, the
        very coroutine of ``_route`` (no frame more on the request path)."""
        if not tracing.enabled():
            return self._route(router, meta, hashes)
        return self._traced_route(router, meta, hashes)

    async def _traced_route(self, router: Router, meta: RequestMeta, hashes: list[int]) -> Decision:
        with tracing.span("route", attributes={"request_id": meta.request_id}) as span:
            d = await self._route(router, meta, hashes)
            span.set_attributes(_route_attributes(d, meta))
            return d

    async def _route(self, router: Router, meta: RequestMeta, hashes: list[int]) -> Decision:
        """The worker for ``meta``, waiting in the router's queue while every eligible one is
        busy (``queue_timeout_s`` at most: then ``NoWorkers``). A wait that ends otherwise (the
        client gone, the router closing) leaves nothing behind: the queue entry is dropped, or,
        if the request was dispatched in the same instant, that dispatch is released."""
        hashes = await self.svc.looked_up(router, hashes)
        d = router.route(meta, block_hashes=hashes)
        if isinstance(d, Pending):
            fut: asyncio.Future[Decision] = asyncio.get_running_loop().create_future()
            self._waiters[meta.request_id] = fut
            try:
                # Not wait_for: on 3.11 it returns a result that lands with a cancel, and the
                # cancel is lost; a bare await raises it, and the dispatch is released below.
                async with asyncio.timeout(self.options.queue_timeout_s):
                    d = await fut
            except TimeoutError:
                self.finish(router, meta.request_id)
                raise NoWorkers(
                    f"timed out after {self.options.queue_timeout_s:g} s waiting for a free "
                    f"{meta.role + ' ' if meta.role else ''}worker",
                    retry_after=1.0,
                ) from None
            except BaseException:
                self.finish(router, meta.request_id)
                raise
            finally:
                self._waiters.pop(meta.request_id, None)
        if self.breakers.dispatched(d.worker_id):
            router.set_blocked(d.worker_id, True)  # the probe: nothing else until it answers
            self._probes[d.request_id] = d.worker_id
        if log.isEnabledFor(logging.DEBUG):  # the line lists every candidate: build it only if shown
            log.debug(d.log_line())
        self.svc.share(router)
        return d

    async def stream(
        self, router: Router, d: Decision, request: GenerateRequest
    ) -> AsyncIterator[GenerateOutput]:
        """One leg, as is (the disaggregated prefill leg): no retry, no migration."""
        async for out in self._leg(router, Leg(d, request)):
            yield out

    def finish(self, router: Router, request_id: str) -> None:
        wid = self._probes.pop(request_id, None)
        if wid is not None and self.breakers.unanswered(wid):
            router.set_blocked(wid, False)
            log.info("worker %s: its probe ended unanswered, the next request is the probe", wid)
        router.cancel(request_id)
        self.svc.share(router)
        self.dispatch_queued(router)

    def dispatch_queued(self, router: Router) -> None:
        for d in router.dispatch_queued():
            fut = self._waiters.get(d.request_id)
            if fut is not None and not fut.done():
                fut.set_result(d)
            else:
                router.on_finish(d.request_id)

    def fail_stranded(self, router: Router, *, rewait: bool = False) -> None:
        """Fail at once the queued requests whose role's last worker left (``NoWorkers``: 503 +
        Retry-After, as a new request gets), instead of leaving them to the queue timeout.
        ``rewait`` (the model is served on demand): a request of no role, stranded only when
        its model has no worker left at all, gets ``PoolEmptied`` instead, and at its first leg
        waits for a new worker as a request arriving at the empty pool does."""
        for meta in router.take_stranded():
            fut = self._waiters.get(meta.request_id)
            if fut is not None and not fut.done():
                role = f"{meta.role} " if meta.role else ""
                error = PoolEmptied if rewait and not meta.role else NoWorkers
                fut.set_exception(error(f"no {role}worker left while it waited", retry_after=1.0))

    def close(self) -> None:
        for fut in self._waiters.values():
            if not fut.done():
                fut.set_exception(NoWorkers("router shutting down"))

    def register_metrics(self, reg: Registry) -> None:
        """Retries, migrations, stalls and breakers, read at scrape time (docs/metrics.md)."""
        rows: tuple[tuple[str, Callable[[], float]], ...] = (
            ("retries_total", lambda: self.metrics.retries),
            ("migrations_total", lambda: self.metrics.migrations),
            ("migrations_exhausted_total", lambda: self.metrics.migrations_exhausted),
            ("stalls_total", lambda: self.metrics.stalls),
            ("worker_aborts_total", lambda: self.metrics.worker_aborts),
            ("migration_recovery_seconds_total", lambda: self.metrics.recovery_s_total),
            ("breaker_opened_total", lambda: self.breakers.opened_total),
            ("breakers_open", self.breakers.open_count),
        )
        for name, get in rows:
            reg.collect(f"interlock_router_{name}", partial(_one, get))


def _one(get: Callable[[], float]) -> tuple[tuple[tuple[str, ...], float]]:
    return (((), get()),)


def _drop_first_token(out: GenerateOutput) -> GenerateOutput:
    """A disaggregated decode's first chunk starts with the prefill's first token: already sent."""
    logprobs = out.logprobs
    if logprobs is not None and len(logprobs) == len(out.token_ids):
        logprobs = logprobs[1:]
    return msgspec.structs.replace(out, token_ids=out.token_ids[1:], logprobs=logprobs)


def _packed(request: GenerateRequest) -> GenerateRequest:
    """The request with its prompt ids packed for the wire (``packed_ids``); as it was when they
    do not fit (the worker's check names them)."""
    try:
        ids = packed_ids.pack(request.token_ids)
    except (OverflowError, TypeError):
        return request
    return request if ids is request.token_ids else msgspec.structs.replace(request, token_ids=ids)


def _meta(request: GenerateRequest, ctx: RequestContext | None) -> RequestMeta:
    """What the router decides on: the request's size and the client's routing hints."""
    return RequestMeta(
        request_id=request.request_id,
        prompt_tokens=len(request.token_ids),
        max_tokens=request.sampling.max_tokens,
        priority=request.priority or (ctx.priority if ctx is not None else 0),
        session_id=ctx.session_id if ctx is not None else None,
        route_key=ctx.route_key if ctx is not None else None,
        worker_id=ctx.worker_id if ctx is not None else None,
    )


def _route_attributes(d: Decision, meta: RequestMeta) -> dict[str, str | int | float]:
    return {
        "worker_id": d.worker_id,
        "reason": d.reason,
        "role": meta.role or "",
        "overlap_blocks": d.overlap_blocks,
        "predicted_cached_tokens": d.cached_tokens,
        "prompt_tokens": d.prompt_tokens,
        "candidates": len(d.candidates),
        "decision_us": round(d.decision_s * 1e6, 1),
    }


def _explain(ctx: RequestContext | None, leg: Leg | None) -> None:
    """The routing decision in the response's headers, when the client asked for it."""
    if ctx is not None and ctx.explain and leg is not None:
        ctx.response_headers[EXPLAIN_HEADER] = leg.decision.header()
