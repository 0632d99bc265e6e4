"""A few lines of asyncio serving ``GET`` on fixed paths (a worker's or the planner's
``/metrics``), so that a process needs no web framework to be scraped."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from interlock.metrics.registry import CONTENT_TYPE, Registry

Handler = Callable[[], tuple[str, bytes]]
"""A path's answer: ``(content type, body)``."""


def metrics_route(registry: Registry) -> Handler:
    return lambda: (CONTENT_TYPE, registry.render().encode())


async def serve_http(routes: Mapping[str, Handler], host: str = "127.0.0.1", port: int = 0) -> asyncio.Server:
    """Serve ``routes`` (path without query -> handler); 404 names the paths there are."""
    known = " or ".join(sorted(routes))

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
            parts = request.split(b" ", 2)
            path = parts[1].decode("ascii", "replace").split("?", 1)[0] if len(parts) > 2 else ""
            handler = routes.get(path)
            if parts[0] != b"GET":
                code, ctype, body = "405 Method Not Allowed", "text/plain", b"GET only\n"
            elif handler is None:
                code, ctype, body = "404 Not Found", "text/plain", f"try {known}\n".encode()
            else:
                code = "200 OK"
                ctype, body = handler()
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
