"""The handshake gate: connections that have not yet proved the cluster secret wait here, on
the server's one accept thread.

A thread per accepted connection let anyone who reaches the port cost the agent a thread (300
silent connections were 300 threads, and 300 warnings). Here one selector drives every pending
handshake (the handshake is sans-I/O, ``protocol.handshake``), and a connection is handed over
for a thread of its own only once it has passed: with a secret, after the peer's proof;
without one, when its first bytes arrive. A pending connection costs a socket and a few bytes;
one that has passed holds its thread while it is open (payloads go out with blocking sends), a
cost only peers with the secret can impose.

Bounds: at most ``max_pending`` connections wait, for at most ``timeout_s`` each. One past the
cap pushes out the oldest waiting one rather than being refused itself: a peer with the secret
passes within a round trip, so it gets in under a flood, where refusing newcomers would let a
flood that holds every slot lock the real peers out.

Refusals are counted (``refused``) and logged through ``RefusalLog``: the first in full, then
one summary line with a count per ``log_interval_s`` while they keep coming.
"""

from __future__ import annotations

import logging
import selectors
import socket
import time
from collections import OrderedDict

from interlock.errors import AuthError
from interlock.protocol.handshake import HELLO_SIZE, RESPONSE_SIZE, ServerHandshake

MAX_PENDING = 128
"""Connections waiting for their handshake at once; one more pushes out the oldest."""
HANDSHAKE_TIMEOUT_S = 5.0
"""A connection that has not passed the handshake (or, without a secret, sent a byte) by then
is dropped."""
LOG_INTERVAL_S = 10.0
"""At most one refusal line per interval, after the first."""
ACCEPT_PAUSE_S = 0.1
"""After accept() fails (out of file descriptors), how long the listener is left alone, so
the loop does not spin on a listener that stays readable."""

log = logging.getLogger(__name__)


class RefusalLog:
    """Which refusal lines to write: the first after a quiet spell in full; then, while they
    keep coming, one count per ``interval_s``. Pure: the caller passes the time and logs."""

    def __init__(self, interval_s: float = LOG_INTERVAL_S) -> None:
        self._interval_s = interval_s
        self._quiet_until = float("-inf")
        self._count = 0
        self._latest = ""

    def refused(self, detail: str, now: float) -> list[str]:
        lines = self.flush(now)
        if now < self._quiet_until:
            self._count += 1
            self._latest = detail
        else:
            self._quiet_until = now + self._interval_s
            lines.append(f"KV transfer: refused a connection {detail}")
        return lines

    def flush(self, now: float) -> list[str]:
        """The summary line of an interval that has ended with refusals in it."""
        if self._count == 0 or now < self._quiet_until:
            return []
        line = f"KV transfer: refused {self._count} more connection(s) since the last report (latest {self._latest})"
        self._count = 0
        self._quiet_until = now + self._interval_s
        return [line]


class _Pending:
    """One connection on its way through the handshake."""

    def __init__(self, sock: socket.socket, secret: bytes | None, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.peer = _peer(sock)
        self._handshake = ServerHandshake(secret) if secret is not None else None
        self._buf = bytearray()
        self._want = HELLO_SIZE

    def advance(self) -> bool:
        """Read exactly what the handshake needs next (never a byte of the first frame, which
        the serving thread reads); True once the peer has passed. AuthError or OSError if not."""
        if self._handshake is None:
            return True  # no secret: these first bytes are a frame, for the serving thread
        try:
            chunk = self.sock.recv(self._want - len(self._buf))
        except BlockingIOError:
            return False
        if not chunk:
            raise ConnectionError("closed during the handshake")
        self._buf += chunk
        if len(self._buf) < self._want:
            return False
        message, self._buf = bytes(self._buf), bytearray()
        if self._handshake.expecting_hello:
            challenge = self._handshake.challenge(message)
            # A fresh connection's send buffer is empty, so only a broken peer takes less.
            if self.sock.send(challenge) != len(challenge):
                raise ConnectionError("could not send the handshake challenge")
            self._want = RESPONSE_SIZE
            return False
        self._handshake.verify(message)
        return True


class Gate:
    """Accepts on ``listener`` and holds each connection until it passes the handshake."""

    def __init__(
        self,
        listener: socket.socket,
        secret: bytes | None,
        *,
        max_pending: int = MAX_PENDING,
        timeout_s: float = HANDSHAKE_TIMEOUT_S,
        log_interval_s: float = LOG_INTERVAL_S,
    ) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be at least 1, not {max_pending}")
        self._listener = listener
        self._secret = secret
        self._max_pending = max_pending
        self._timeout_s = timeout_s
        self._log = RefusalLog(log_interval_s)
        self._pending: OrderedDict[socket.socket, _Pending] = OrderedDict()
        """In arrival order, which is deadline order (one timeout for all)."""
        self._selector = selectors.DefaultSelector()
        listener.setblocking(False)
        self._selector.register(listener, selectors.EVENT_READ)
        self._accept_paused_until: float | None = None
        self.refused = 0
        """Connections dropped before they passed the handshake."""

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    def poll(self, timeout_s: float) -> list[socket.socket]:
        """Wait up to ``timeout_s`` (less if a handshake expires sooner) and move every ready
        handshake on; returns the connections that passed, blocking again, for their threads."""
        now = time.monotonic()
        self._resume_accepting(now)
        wake = now + timeout_s
        if self._pending:
            wake = min(wake, self._oldest().deadline)
        if self._accept_paused_until is not None:
            wake = min(wake, self._accept_paused_until)
        passed = []
        for key, _ in self._selector.select(max(0.0, wake - now)):
            pending: _Pending | None = key.data
            if pending is None:
                self._accept()
            elif pending.sock in self._pending and self._advance(pending):  # not pushed out just now
                passed.append(self._release(pending))
        now = time.monotonic()
        while self._pending and self._oldest().deadline <= now:
            self._refuse(self._oldest(), f"no handshake within {self._timeout_s:g} s")
        self._write(self._log.flush(now))
        return passed

    def close(self) -> None:
        for pending in list(self._pending.values()):
            self._drop(pending)
        self._selector.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as e:  # out of file descriptors, most likely: back off a little
                log.warning("KV transfer: accept failed: %s", e)
                self._selector.unregister(self._listener)
                self._accept_paused_until = time.monotonic() + ACCEPT_PAUSE_S
                return
            conn.setblocking(False)
            # Push out before adding, so ``num_pending`` (read from other threads) never shows
            # one past the cap, not even between these lines.
            if len(self._pending) >= self._max_pending:
                self._refuse(
                    self._oldest(), f"pushed out: {self._max_pending} connections waited for the handshake"
                )
            pending = _Pending(conn, self._secret, time.monotonic() + self._timeout_s)
            self._pending[conn] = pending
            self._selector.register(conn, selectors.EVENT_READ, pending)

    def _oldest(self) -> _Pending:
        return next(iter(self._pending.values()))

    def _resume_accepting(self, now: float) -> None:
        if self._accept_paused_until is not None and now >= self._accept_paused_until:
            self._accept_paused_until = None
            self._selector.register(self._listener, selectors.EVENT_READ)

    def _advance(self, pending: _Pending) -> bool:
        try:
            return pending.advance()
        except (AuthError, OSError) as e:
            self._refuse(pending, str(e) or type(e).__name__)
            return False

    def _release(self, pending: _Pending) -> socket.socket:
        self._selector.unregister(pending.sock)
        del self._pending[pending.sock]
        pending.sock.setblocking(True)
        return pending.sock

    def _refuse(self, pending: _Pending, reason: str) -> None:
        self.refused += 1
        self._write(self._log.refused(f"from {pending.peer}: {reason}", time.monotonic()))
        self._drop(pending)

    def _drop(self, pending: _Pending) -> None:
        self._selector.unregister(pending.sock)
        del self._pending[pending.sock]
        pending.sock.close()

    @staticmethod
    def _write(lines: list[str]) -> None:
        for line in lines:
            log.warning("%s", line)


def _peer(conn: socket.socket) -> object:
    try:
        return conn.getpeername()
    except OSError:
        return "?"
