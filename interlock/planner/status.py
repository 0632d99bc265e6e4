"""The planner's status over HTTP: ``GET /planner`` (JSON: policy, what each pool wants, why it
holds, every decision with its reason) and ``GET /metrics`` (decision counts, Prometheus text).
A few lines of asyncio, so the planner needs no web framework; ``interlock planner status``
reads it.
"""

from __future__ import annotations

import asyncio
import json

from interlock.planner.loop import PlannerLoop

PATH = "/planner"


def prometheus_text(loop: PlannerLoop) -> str:
    status = loop.status()
    counts = status["decisions_total"]
    assert isinstance(counts, dict)
    lines = [
        "# HELP interlock_planner_decisions_total Planner actions, by kind.",
        "# TYPE interlock_planner_decisions_total counter",
    ]
    for kind in ("add", "remove", "switch"):
        lines.append(f'interlock_planner_decisions_total{{kind="{kind}"}} {counts.get(kind, 0)}')
    lines += [
        "# TYPE interlock_planner_tick_errors_total counter",
        f"interlock_planner_tick_errors_total {status['errors']}",
    ]
    return "\n".join(lines) + "\n"


async def serve_status(loop: PlannerLoop, host: str = "127.0.0.1", port: int = 0) -> asyncio.Server:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
            parts = request.split(b" ", 2)
            path = parts[1].decode("ascii", "replace") if len(parts) > 2 else ""
            if parts[0] != b"GET":
                code, ctype, body = "405 Method Not Allowed", "text/plain", b"GET only\n"
            elif path == PATH:
                code, ctype = "200 OK", "application/json"
                body = json.dumps(loop.status()).encode()
            elif path == "/metrics":
                code, ctype, body = "200 OK", "text/plain; version=0.0.4", prometheus_text(loop).encode()
            else:
                code, ctype, body = "404 Not Found", "text/plain", b"try /planner or /metrics\n"
            writer.write(
                f"HTTP/1.1 {code}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                f"Connection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, host, port)
