"""A TCP proxy whose link can be cut and restored, for ``fleet_scale.py``'s NATS link cut.

    python benchmarks/fleet_proxy.py TARGET_PORT MODE     # prints "listening PORT"

Everything it accepts on a free loopback port is forwarded to ``127.0.0.1:TARGET_PORT``.
SIGUSR1 cuts the link, SIGUSR2 restores it. ``MODE``:

* ``hang``: a partition that heals. Bytes stop flowing both ways (at most one read chunk per
  direction is held) while the sockets stay open; on restore what TCP would have retransmitted
  flows again. The client notices only by its own probes and pings.
* ``drop``: the connections are reset, and new ones are accepted and closed at once until the
  restore (what the client sees when the server restarts).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys

CHUNK = 256 * 1024


class Proxy:
    def __init__(self, target_port: int, mode: str) -> None:
        self.target_port = target_port
        self.mode = mode
        self.open = asyncio.Event()
        self.open.set()
        self.writers: set[asyncio.StreamWriter] = set()

    def cut(self) -> None:
        self.open.clear()
        if self.mode == "drop":
            for writer in list(self.writers):
                writer.transport.abort()

    def restore(self) -> None:
        self.open.set()

    async def accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.open.is_set() and self.mode == "drop":
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self.writers |= {writer, up_writer}
        pumps = [
            asyncio.create_task(self._pump(reader, up_writer)),
            asyncio.create_task(self._pump(up_reader, writer)),
        ]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            pass  # the proxy stops: the connection goes with it
        for task in pumps:
            task.cancel()
        for w in (writer, up_writer):
            self.writers.discard(w)
            w.transport.abort()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while True:
                await self.open.wait()
                data = await reader.read(CHUNK)
                if not data:
                    return
                await self.open.wait()  # a cut in the middle holds the chunk read
                writer.write(data)
                await writer.drain()


async def serve(target_port: int, mode: str) -> None:
    proxy = Proxy(target_port, mode)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGUSR1, proxy.cut)
    loop.add_signal_handler(signal.SIGUSR2, proxy.restore)
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    server = await asyncio.start_server(proxy.accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    print(f"listening {port}", flush=True)
    async with server:
        await stop.wait()
        proxy.mode = "drop"
        proxy.cut()  # ends every pump, so no connection outlives the loop
        await asyncio.sleep(0.1)


def main() -> None:
    target, mode = int(sys.argv[1]), sys.argv[2]
    if mode not in ("hang", "drop"):
        raise SystemExit(f"mode must be hang or drop, not {mode!r}")
    asyncio.run(serve(target, mode))


if __name__ == "__main__":
    main()
