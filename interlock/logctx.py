"""The request a log line is about: a context variable set while a request is served (the
frontend's handler, a worker's stream), and a logging filter that puts it on every record as
``request_id`` (``cluster.logs`` prints it in text and JSON lines alike); and ``utc``, the one
wall-clock stamp of operator-facing lines and events."""

from __future__ import annotations

import logging
import time
from contextvars import ContextVar

REQUEST_ID: ContextVar[str | None] = ContextVar("interlock_request_id", default=None)


class RequestIdFilter(logging.Filter):
    """Adds ``record.request_id`` from ``REQUEST_ID`` (a record given one explicitly keeps it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            record.request_id = REQUEST_ID.get()
        return True


def utc(t: float) -> str:
    """``t`` (seconds since the epoch) as ISO 8601 in UTC with milliseconds: 2026-12-05T16:19:12.345Z."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"
