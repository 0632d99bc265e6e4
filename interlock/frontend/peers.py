"""The frontend processes that serve one port together (``control-plane.frontend_workers``).

The kernel hands each new connection to one of them (SO_REUSEPORT). Each parses, tokenizes and
routes its own requests; their routers share state as router replicas do (KV events, load
reports, dispatch-time load over the event plane). What a user sees as one frontend is made one
here, over a private Unix socket per process (in a folder only this user can enter):

- ``/metrics`` on any of them sums every process's figures (``metrics.merge``);
- the dashboard is the first process's (index 0), which adds the others' figures each second;
  another process's ``/dashboard/events`` is the first one's stream, passed through;
- a stored response (``previous_response_id``, ``GET /v1/responses/{id}``) is found in
  whichever process kept it.

The planner, in the first process, reads the others' traffic over the same sockets (routes a
caller adds: ``cluster.frontends``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgspec

PEER_TIMEOUT_S = 2.0
PEER_PREFIX = "/peer"


@dataclass(frozen=True)
class PeerSet:
    """The processes serving one port, as process ``index`` sees them: every one's private
    socket, by index (0: the first, which holds the dashboard and the planner)."""

    index: int
    sockets: tuple[str, ...]

    def __post_init__(self) -> None:
        if not 0 <= self.index < len(self.sockets):
            raise ValueError(f"peer index {self.index} is not one of {len(self.sockets)} sockets")

    @property
    def primary(self) -> bool:
        return self.index == 0

    @property
    def socket(self) -> str:
        return self.sockets[self.index]

    def others(self) -> list[int]:
        return [i for i in range(len(self.sockets)) if i != self.index]


class Peers:
    """Requests to the other processes' private sockets; one that does not answer within
    ``timeout_s`` is left out (None), never waited on longer."""

    def __init__(self, peer_set: PeerSet, *, timeout_s: float = PEER_TIMEOUT_S) -> None:
        self.set = peer_set
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._sessions: dict[int, aiohttp.ClientSession] = {}
        self._last: dict[tuple[int, str], bytes] = {}

    def _session(self, index: int) -> aiohttp.ClientSession:
        session = self._sessions.get(index)
        if session is None or session.closed:
            connector = aiohttp.UnixConnector(path=self.set.sockets[index])
            session = self._sessions[index] = aiohttp.ClientSession(connector=connector, timeout=self.timeout)
        return session

    async def request(self, index: int, method: str, path: str, body: Any = None) -> bytes | None:
        """The body of a 200 answer from process ``index``; None for any other answer, an
        error or a timeout."""
        data = None if body is None else msgspec.json.encode(body)
        try:
            async with self._session(index).request(method, f"http://peer{path}", data=data) as resp:
                return await resp.read() if resp.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, OSError):
            return None

    async def each(
        self, method: str, path: str, body: Any = None, *, last: bool = False
    ) -> list[bytes | None]:
        """Every other process's answer, asked at once, in index order. ``last``: one that does
        not answer this time gives its last answer to ``path`` (running totals must not dip
        because a process was slow once)."""
        others = self.set.others()
        answers = list(await asyncio.gather(*(self.request(i, method, path, body) for i in others)))
        if last:
            for k, (i, answer) in enumerate(zip(others, answers, strict=True)):
                if answer is not None:
                    self._last[i, path] = answer
                else:
                    answers[k] = self._last.get((i, path))
        return answers

    async def first(self, method: str, path: str) -> bytes | None:
        """The first answer any other process gives (None: none did)."""
        pending = {asyncio.ensure_future(self.request(i, method, path)) for i in self.set.others()}
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    if task.result() is not None:
                        return task.result()
            return None
        finally:
            for task in pending:
                task.cancel()

    async def relay(self, index: int, path: str, write: Any) -> None:
        """Pass process ``index``'s stream at ``path`` to ``write`` until it ends (no total
        deadline: an event stream lasts while its page is open)."""
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.timeout.total)
        async with self._session(index).get(f"http://peer{path}", timeout=timeout) as resp:
            async for chunk in resp.content.iter_any():
                await write(chunk)

    async def close(self) -> None:
        sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            await session.close()


def own_folder(path: str) -> None:
    """Make ``path`` a folder only this user can enter (the sockets' folder)."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)


def remove_socket(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def summed(rows: Sequence[Sequence[float]]) -> list[float]:
    """Column sums of equal-length rows of figures."""
    return [sum(column) for column in zip(*rows, strict=True)]
