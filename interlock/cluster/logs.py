"""How a long-running command's logs look: text (the default) or one JSON object per line.

JSON lines carry a wall-clock UTC timestamp with milliseconds (``ts``), ``level``, ``logger``,
``msg``, the process that wrote it (``process``: ``serve``'s children are named by it when it
relays their output) and any ``request_id`` a record carries, then ``exc`` with a traceback.
An operator's log pipeline can parse every line without a regular expression.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from typing import Any

from interlock.env import LOG_FORMAT_VAR
from interlock.logctx import RequestIdFilter, utc

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOG_FORMATS = ("text", "json")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": utc(record.created),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None)
        if request_id is not None:
            entry["request_id"] = request_id
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


_current = "text"


class TextFormatter(logging.Formatter):
    """``LOG_FORMAT``, then ``request_id=...`` when the record is about a request."""

    def __init__(self) -> None:
        super().__init__(LOG_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        request_id = getattr(record, "request_id", None)
        return f"{line} request_id={request_id}" if request_id is not None else line


class BufferedHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler that writes INFO and below in batches: at most ``FLUSH_S`` late, at once
    past ``MAX_BUFFERED`` characters, and every WARNING or worse at once (with what came before
    it, in order). One write per batch instead of one per line, as nginx's ``access_log ...
    buffer=``: in a frontend at 1,300 requests a second an access line's logging took 34 µs of CPU
    with a write each, 25–29 in batches (BENCHMARKS.md, "Cost of observability"). A daemon thread
    flushes; ``logging.shutdown`` at exit flushes the rest."""

    FLUSH_S = 0.2
    MAX_BUFFERED = 64 * 1024

    def __init__(self, stream: Any = None) -> None:
        super().__init__(stream)
        self._pending: list[str] = []
        self._size = 0
        self._wake = threading.Event()
        threading.Thread(target=self._flusher, name="log-flush", daemon=True).start()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + self.terminator
        except Exception:  # noqa: BLE001 - logging's own policy: report, never raise
            self.handleError(record)
            return
        with self.lock:  # type: ignore[union-attr]
            self._pending.append(line)
            self._size += len(line)
            urgent = record.levelno >= logging.WARNING or self._size >= self.MAX_BUFFERED
        if urgent:
            self.flush()

    def flush(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            if self._pending:
                text, self._pending, self._size = "".join(self._pending), [], 0
                try:
                    self.stream.write(text)
                except (OSError, ValueError):  # a closed or broken stream: nothing to do
                    pass
            with contextlib.suppress(OSError, ValueError):
                self.stream.flush()

    def _flusher(self) -> None:
        while not self._wake.wait(self.FLUSH_S):
            self.flush()


def configure(level: str, fmt: str) -> None:
    """The root logger's level and format (``LOG_FORMATS``); this process's children log in the
    same format (``child_env``). Every line says which request it is about, if any
    (``interlock.logctx``)."""
    global _current
    _current = fmt
    # No line of ours shows the source position: not taking it saves a stack walk per record
    # (every request writes an access line at INFO). The process and thread ids stay (a getpid,
    # 0.25 µs): a library's own handler may print them, as vLLM's does (``pid=%(process)d``,
    # which failed on every record of a vLLM worker while they were None).
    logging.logMultiprocessing = False
    logging._srcfile = None
    handler = BufferedHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(RequestIdFilter())
    # JSON replaces whatever was there; text leaves an existing setup (a test's capture) alone.
    logging.basicConfig(level=level, handlers=[handler], force=fmt == "json")


def json_logs() -> bool:
    return _current == "json"


def child_env() -> dict[str, str]:
    """What a child process needs to log as this one does."""
    return {LOG_FORMAT_VAR: _current}


def tag_json_line(line: bytes, process: str) -> bytes | None:
    """A child's JSON log line with ``"process"`` added first; None if ``line`` is not one."""
    if not (line.startswith(b"{") and line.rstrip().endswith(b"}")):
        return None
    return b'{"process": ' + json.dumps(process).encode() + b", " + line[1:]
