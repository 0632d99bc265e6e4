"""The access log: one INFO line per generation request on the ``interlock.access`` logger (ids,
status, tokens, time, and the client's ``user``/``safety_identifier``/``metadata``)."""

from __future__ import annotations

import logging
from time import perf_counter

from aiohttp import web

from interlock.frontend.backend import HEADER_REQUEST_ID
from interlock.frontend.generation import Choices
from interlock.frontend.schemas import ChatCompletionRequest, CompletionRequest

access_log = logging.getLogger("interlock.access")


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
    access_log.info(
        "%s %s %s status=%d client_id=%s model=%s workers=%s prompt=%d completion=%d cached=%d "
        "ttft_ms=%.1f ms=%.1f finish=%s migrations=%d user=%s safety_identifier=%s metadata=%s",
        access.request_id if access is not None else "-",
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
    )
