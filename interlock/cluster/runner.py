"""How every long-running subcommand starts: logging, uvloop, and config errors as exit code 2."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Coroutine
from typing import Any

from interlock.cluster.logs import configure
from interlock.env import get_env
from interlock.errors import ConfigError
from interlock.metrics import tracing


def run_command(
    prog: str,
    coro: Coroutine[Any, Any, int],
    *,
    log_level: str,
    log_format: str | None = None,
    tracing_on: bool | None = None,
) -> int:
    """Run ``coro`` on uvloop; a ConfigError prints one line naming the problem and exits 2.
    ``log_format``: "text" or "json" (``cluster.logs``; None: ``INTERLOCK_LOG_FORMAT``);
    ``tracing_on``: OpenTelemetry traces (``metrics.tracing``; None: ``INTERLOCK_TRACING``)."""
    configure(log_level, log_format or get_env().log_format)
    try:
        on = get_env().tracing if tracing_on is None else tracing_on
        tracing.configure(on, prog.replace(" ", "-"), otlp=get_env().otlp_protocol)
    except tracing.TracingUnavailable as e:
        coro.close()
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover - uvloop is a dependency; plain asyncio still works
        pass
    try:
        return asyncio.run(coro)
    except ConfigError as e:
        coro.close()
        print(f"{prog}: {e.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    finally:
        tracing.shutdown()  # the last spans flushed
