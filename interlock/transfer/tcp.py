"""TCP transport: a per-agent server that sends staged payloads, and a puller per transfer.

No copies beyond the socket's: the server ``sendall``s the staging memoryview and the puller
``recv_into``s a preallocated buffer (plain asyncio streams were 7x slower here, FACTS.md).
Blocking sockets on background threads keep the code short and release the GIL during I/O;
the engine thread only flips state. A connection carries control frames (``frames``) and, for
a pull, exactly one payload: ``Pull(id)`` -> ``Ready(n)`` + n bytes -> ``Ack``. The n bytes
go out as the source marks them ready (a streamed payload is sent while it is written) and the
puller's progress follows what it has received (imported while the rest arrives). The source is
DONE on the Ack; a broken connection fails both sides at once (a SIGKILLed process's sockets
are closed by its kernel), and a stalled peer hits the transfer's deadline.

With a cluster secret every connection opens with the mutual handshake (``protocol.handshake``)
before its first frame: a peer without the secret can neither pull a payload (someone's prompt,
in KV form) nor pose as a source. The server's handshakes all run on its accept thread
(``gate``); a connection gets a thread of its own only once it has passed.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Callable

import msgspec

from interlock.errors import AuthError
from interlock.protocol.handshake import CHALLENGE_SIZE, ClientHandshake
from interlock.protocol.transfer import TransferDescriptor
from interlock.transfer import frames as fr
from interlock.transfer.base import TransferStatus
from interlock.transfer.dest import _Dest
from interlock.transfer.gate import Gate
from interlock.transfer.pool import RecvPool
from interlock.transfer.source import Source, _shutdown

CONTROL_TIMEOUT_S = 30.0
"""An idle control connection is dropped after this long."""
STREAM_CHECK_S = 0.05
"""While a streamed payload waits for its next chunk, how often the sender checks that the
destination is still connected (one that gave up frees the source at once, not at its timeout)."""


def _recv(sock: socket.socket, size: int) -> bytes:
    buf = bytearray(size)
    fr.recv_exact(sock, memoryview(buf))
    return bytes(buf)


def client_handshake(sock: socket.socket, secret: bytes | None) -> None:
    """Prove we know the secret and check the server does; AuthError if it does not."""
    if secret is None:
        return
    hs = ClientHandshake(secret)
    sock.sendall(hs.hello())
    sock.sendall(hs.answer(_recv(sock, CHALLENGE_SIZE)))


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


class TcpServer:
    """Accepts pulls, pings and probes; runs ``tick`` about every ``tick_s`` on its thread,
    which also runs every handshake (``gate``)."""

    def __init__(
        self,
        *,
        host: str,
        port: int,
        advertise_host: str,
        lookup: Callable[[str], Source | None],
        probe: Callable[[int, float], TransferDescriptor],
        tick: Callable[[], None],
        tick_s: float = 0.2,
        secret: bytes | None = None,
    ) -> None:
        self._lookup, self._probe, self._tick = lookup, probe, tick
        self._tick_s = tick_s
        self._listener = socket.create_server((host, port))
        self.address = f"{advertise_host}:{self._listener.getsockname()[1]}"
        self._gate = Gate(self._listener, secret)
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._accept_loop, name="interlock-transfer", daemon=True)
        self._thread.start()

    @property
    def refused(self) -> int:
        """Connections dropped before they passed the handshake."""
        return self._gate.refused

    @property
    def num_pending(self) -> int:
        """Connections waiting for their handshake."""
        return self._gate.num_pending

    def close(self) -> None:
        self._closed = True
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            _shutdown(conn)
        self._thread.join(timeout=5.0)
        self._listener.close()

    def _accept_loop(self) -> None:
        next_tick = time.monotonic()
        try:
            while not self._closed:
                for conn in self._gate.poll(max(0.0, next_tick - time.monotonic())):
                    with self._lock:
                        self._conns.add(conn)
                    threading.Thread(
                        target=self._serve, args=(conn,), name="interlock-transfer-conn", daemon=True
                    ).start()
                if time.monotonic() >= next_tick:
                    self._tick()
                    next_tick = time.monotonic() + self._tick_s
        finally:
            self._gate.close()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(CONTROL_TIMEOUT_S)
            while (frame := fr.recv_frame(conn)) is not None:
                if isinstance(frame, fr.Ping):
                    fr.send_frame(conn, fr.Pong())
                elif isinstance(frame, fr.Probe):
                    self._tick()  # recycle the previous probe's buffer first, as a busy engine would
                    fr.send_frame(conn, fr.ProbeOffer(self._probe(frame.nbytes, frame.timeout_s)))
                elif isinstance(frame, fr.Pull):
                    self._send_payload(conn, frame.transfer_id)
                    return
                else:
                    return
        except (OSError, ValueError, msgspec.DecodeError):
            pass
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def _send_payload(self, conn: socket.socket, transfer_id: str) -> None:
        source = self._lookup(transfer_id)
        claim = source.claim("tcp", conn) if source is not None else "unknown transfer (ended or expired)"
        if isinstance(claim, str):
            fr.send_frame(conn, fr.Refused(claim))
            return
        assert source is not None
        try:
            # Blocking from here: no poll() per send. The source's deadline (housekeeping) or an
            # abort shuts the socket down, which ends a stalled send at once.
            conn.settimeout(None)
            fr.send_frame(conn, fr.Ready(len(claim)))
            sent = 0
            while sent < len(claim):
                ready = source.wait_ready(sent, min(source.remaining_s(), STREAM_CHECK_S))
                if ready > sent:
                    conn.sendall(claim[sent:ready])
                    sent = ready
                elif source.poll().finished:  # aborted, or past its deadline
                    return
                elif _peer_closed(conn):
                    source.fail("destination disconnected while the payload was written")
                    return
            ack = fr.recv_frame(conn)
        except (OSError, ValueError, msgspec.DecodeError) as e:
            source.fail(f"destination disconnected: {e or type(e).__name__}")
            return
        if isinstance(ack, fr.Ack):
            source.complete()
        else:
            source.fail("destination closed before acknowledging")


class TcpDest(_Dest):
    """Pulls one payload on its own thread into a buffer from the agent's receive pool."""

    transport = "tcp"

    def __init__(
        self, descriptor: TransferDescriptor, timeout_s: float, pool: RecvPool, secret: bytes | None = None
    ) -> None:
        super().__init__(descriptor, timeout_s)
        self._secret = secret
        self._pool = pool
        self._buf: bytearray | None = None
        self._sock: socket.socket | None = None
        self._thread = threading.Thread(target=self._run, name="interlock-pull", daemon=True)
        self._thread.start()

    def poll(self) -> TransferStatus:
        if not self._status.finished:
            self._overdue()
        return self._status

    def _on_release(self) -> None:
        buf, self._buf = self._buf, None
        if buf is not None:
            self._pool.give(buf)

    def _on_fail(self, reason: str) -> None:
        # A buffer the thread may still be writing into never goes back to the pool.
        self._buf = None
        sock = self._sock
        if sock is not None:
            _shutdown(sock)

    def _run(self) -> None:
        try:
            self._pull()
        except AuthError as e:
            self._fail(str(e))
        except (OSError, ValueError, msgspec.DecodeError) as e:
            self._fail(f"source disconnected: {e or type(e).__name__}")

    def _pull(self) -> None:
        remaining = self._deadline - time.monotonic()
        sock = socket.create_connection(
            split_address(self.descriptor.tcp_address), timeout=max(0.001, remaining)
        )
        with self._lock:
            if self._status.finished:
                sock.close()
                return
            self._sock = sock
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(max(0.001, self._deadline - time.monotonic()))
            client_handshake(sock, self._secret)
            fr.send_frame(sock, fr.Pull(self.transfer_id))
            reply = fr.recv_frame(sock)
            if isinstance(reply, fr.Refused):
                self._fail(reply.reason)
                return
            if not isinstance(reply, fr.Ready) or reply.nbytes != self.descriptor.nbytes:
                self._fail(f"unexpected reply {reply!r}")
                return
            buf = self._pool.take(reply.nbytes)
            view = memoryview(buf)[: reply.nbytes]
            self._buf = buf
            self._claimed(view, 0)
            sock.settimeout(None)  # as on the server: ``poll`` past the deadline shuts it down
            got = 0
            while got < len(view):
                n = sock.recv_into(view[got:])
                if n == 0:
                    raise ConnectionError(f"peer closed after {got} of {len(view)} bytes")
                got += n
                self._advance(got, finish=False)
            fr.send_frame(sock, fr.Ack())
            self._advance(got)
        finally:
            self._sock = None
            sock.close()


class ControlClient:
    """A blocking control connection to an agent's server, for link checks."""

    def __init__(self, address: str, timeout_s: float = 10.0, secret: bytes | None = None) -> None:
        self._sock = socket.create_connection(split_address(address), timeout=timeout_s)
        try:
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            client_handshake(self._sock, secret)
        except BaseException:
            self._sock.close()
            raise

    def ping(self) -> float:
        """One round trip, in seconds."""
        t0 = time.perf_counter()
        fr.send_frame(self._sock, fr.Ping())
        if not isinstance(fr.recv_frame(self._sock), fr.Pong):
            raise ConnectionError("bad ping reply")
        return time.perf_counter() - t0

    def probe(self, nbytes: int, timeout_s: float) -> TransferDescriptor:
        fr.send_frame(self._sock, fr.Probe(nbytes, timeout_s))
        reply = fr.recv_frame(self._sock)
        if not isinstance(reply, fr.ProbeOffer):
            raise ConnectionError(f"bad probe reply {reply!r}")
        return reply.descriptor

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _peer_closed(conn: socket.socket) -> bool:
    """The peer closed or reset the connection (it sends nothing else before the Ack)."""
    try:
        readable, _, _ = select.select([conn], [], [], 0)
        return bool(readable) and conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
