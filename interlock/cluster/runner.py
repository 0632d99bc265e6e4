"""How every long-running subcommand starts: logging, uvloop, and config errors as exit code 2."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Coroutine
from typing import Any

from interlock.errors import ConfigError

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def run_command(prog: str, coro: Coroutine[Any, Any, int], *, log_level: str) -> int:
    """Run ``coro`` on uvloop; a ConfigError prints one line naming the problem and exits 2."""
    logging.basicConfig(level=log_level, format=LOG_FORMAT)
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
