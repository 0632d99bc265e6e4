"""Access lines wait for their moment's others and go out together, in order, each dated when its
request ended and naming its request, within FLUSH_S; a stopping frontend flushes them."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from interlock.frontend.access import AccessLog

ARGS = ("r", "127.0.0.1", "chat", 200, "-", "m", "w0", 3, 4, 0, 1.5, 2.5, "stop", 0, None, None, None)


def test_lines_go_out_together_dated_when_their_requests_ended(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("interlock.test_access")
    access = AccessLog(log, flush_s=0.05)

    async def main() -> tuple[int, float]:
        ended = time.time()
        for i in range(3):
            access.add(f"r{i}", (f"r{i}", *ARGS[1:]))
        waiting = len([r for r in caplog.records if r.name == log.name])
        await asyncio.sleep(0.2)
        return waiting, ended

    with caplog.at_level(logging.INFO, logger=log.name):
        waiting, ended = asyncio.run(main())
    records = [r for r in caplog.records if r.name == log.name]
    assert waiting == 0 and [r.request_id for r in records] == ["r0", "r1", "r2"]  # type: ignore[attr-defined]
    assert records[0].getMessage().startswith("r0 127.0.0.1 chat status=200")
    assert all(abs(r.created - ended) < 0.05 for r in records)


def test_flush_writes_what_waits_at_once(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("interlock.test_access_flush")
    access = AccessLog(log, flush_s=60.0)

    async def main() -> None:
        access.add("r", ARGS)
        access.flush()

    with caplog.at_level(logging.INFO, logger=log.name):
        asyncio.run(main())
    assert [r.getMessage().split()[0] for r in caplog.records if r.name == log.name] == ["r"]
