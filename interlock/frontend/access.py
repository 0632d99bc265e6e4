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
    if not access_log.isEnabledFor(logging.INFO):
        return
    access = request.get(ACCESS)
    req = access.req if access is not None else None
    choices = access.choices if access is not None else None
    used = choices.usage() if choices is not None else None
    access_log.info(
        "%s %s %s status=%d client_id=%s model=%s prompt=%d completion=%d cached=%d ms=%.1f "
        "user=%s safety_identifier=%s metadata=%s",
        access.request_id if access is not None else "-",
        request.remote,
        endpoint,
        status,
        request.headers.get(HEADER_REQUEST_ID, "-"),
        req.model if req is not None else "-",
        used["prompt_tokens"] if used is not None else 0,
        used["completion_tokens"] if used is not None else 0,
        used["prompt_tokens_details"]["cached_tokens"] if used is not None else 0,
        (perf_counter() - choices.gens[0].started) * 1000 if choices is not None else 0.0,
        req.user if req is not None else None,
        req.safety_identifier if req is not None else None,
        req.metadata if req is not None else None,
    )
