"""The access log: one INFO line per generation request on the ``interlock.access`` logger (ids,
status, tokens, time, and the client's ``user``/``safety_identifier``/``metadata``).

A request's end takes only its line's values (``log_access``); the lines are logged together a
moment later (``AccessLog``, at most ``FLUSH_S`` after the first of them), each record dated when
its request ended. Logged one at a time between requests, a line cost 46–51 µs of the frontend's
CPU (a cold path each time); in a batch the logging code stays warm (BENCHMARKS.md, "Cost of
observability")."""

from __future__ import annotations

import asyncio
import logging
import time
from time import perf_counter

from aiohttp import web

from interlock.frontend.backend import HEADER_REQUEST_ID
from interlock.frontend.generation import Choices
from interlock.frontend.schemas import ChatCompletionRequest, CompletionRequest

access_log = logging.getLogger("interlock.access")
FLUSH_S = 0.1
FORMAT = (
    "%s %s %s status=%d client_id=%s model=%s workers=%s prompt=%d completion=%d cached=%d "
    "ttft_ms=%.1f ms=%.1f finish=%s migrations=%d user=%s safety_identifier=%s metadata=%s"
)


class AccessLog:
    """Access lines waiting to be logged, in the order their requests ended."""

    def __init__(self, logger: logging.Logger = access_log, flush_s: float = FLUSH_S) -> None:
        self.logger = logger
        self.flush_s = flush_s
        self._pending: list[tuple[float, str, tuple[object, ...]]] = []
        self._timer: asyncio.TimerHandle | None = None

    def add(self, request_id: str, args: tuple[object, ...]) -> None:
        self._pending.append((time.time(), request_id, args))
        if self._timer is None:
            try:
                self._timer = asyncio.get_running_loop().call_later(self.flush_s, self.flush)
            except RuntimeError:  # no loop (never in the server): at once
                self.flush()

    def flush(self) -> None:
        """Log every waiting line now (also at shutdown)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        pending, self._pending = self._pending, []
        log = self.logger
        for created, request_id, args in pending:
            record = log.makeRecord(
                log.name, logging.INFO, __file__, 0, FORMAT, args, None, extra={"request_id": request_id}
            )
            record.created, record.msecs = created, (created % 1) * 1000
            log.handle(record)


ACCESS_LOG = AccessLog()
"""This process's access lines (the frontend flushes it when it stops)."""


class Access:
    """What the access line of one generation request needs, kept on the aiohttp request."""

    __slots__ = ("request_id", "req", "choices")

    def __init__(self, request_id: str, req: ChatCompletionRequest | CompletionRequest) -> None:
        self.request_id = request_id
        self.req = req
        self.choices: Choices | None = None


ACCESS = web.RequestKey("interlock_access", Access)


def log_access(request: web.Request, endpoint: str, status: int) -> None:
    """The request's one line: ids, client, model, worker(s), tokens, time to first token, time,
    status, finish reason(s), migrations, and what the client said of its end user."""
    if not access_log.isEnabledFor(logging.INFO):
        return
    access = request.get(ACCESS)
    req = access.req if access is not None else None
    choices = access.choices if access is not None else None
    used = choices.usage() if choices is not None else None
    workers: list[str] = []
    finishes: list[str] = []
    migrations = 0
    ttft_ms = -1.0
    if choices is not None:
        contexts = {id(g.ctx): g.ctx for g in choices.gens}
        workers = list(dict.fromkeys(w for c in contexts.values() for w in c.workers))
        migrations = sum(c.migrations for c in contexts.values())
        finishes = list(dict.fromkeys(g.assembler.finish_reason or "-" for g in choices.gens))
        firsts = [g.first_token_at for g in choices.gens if g.first_token_at]
        if firsts:
            ttft_ms = (min(firsts) - choices.gens[0].started) * 1000
    request_id = access.request_id if access is not None else "-"
    ACCESS_LOG.add(
        request_id,
        (
            request_id,
            request.remote,
            endpoint,
            status,
            request.headers.get(HEADER_REQUEST_ID, "-"),
            req.model if req is not None else "-",
            ",".join(workers) or "-",
            used["prompt_tokens"] if used is not None else 0,
            used["completion_tokens"] if used is not None else 0,
            used["prompt_tokens_details"]["cached_tokens"] if used is not None else 0,
            ttft_ms,
            (perf_counter() - choices.gens[0].started) * 1000 if choices is not None else 0.0,
            ",".join(finishes) or "-",
            migrations,
            req.user if req is not None else None,
            req.safety_identifier if req is not None else None,
            req.metadata if req is not None else None,
        ),
    )
