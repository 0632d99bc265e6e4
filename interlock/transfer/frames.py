"""Control frames of the TCP transport: a 4-byte length, then one msgpack-encoded message.

Bulk payload bytes never go through msgspec: after ``Ready(nbytes)`` the server writes the
payload memoryview straight to the socket and the client reads it straight into its buffer.
"""

from __future__ import annotations

import socket
import struct

import msgspec

from interlock.protocol.transfer import TransferDescriptor

MAX_FRAME = 1 << 20
_LEN = struct.Struct("!I")


class Pull(msgspec.Struct, frozen=True, tag="pull"):
    transfer_id: str


class Ready(msgspec.Struct, frozen=True, tag="ready"):
    nbytes: int


class Refused(msgspec.Struct, frozen=True, tag="refused"):
    reason: str


class Ack(msgspec.Struct, frozen=True, tag="ack"):
    pass


class Ping(msgspec.Struct, frozen=True, tag="ping"):
    pass


class Pong(msgspec.Struct, frozen=True, tag="pong"):
    pass


class Probe(msgspec.Struct, frozen=True, tag="probe"):
    """Link check: stage ``nbytes`` of filler and offer it like a real payload."""

    nbytes: int
    timeout_s: float


class ProbeOffer(msgspec.Struct, frozen=True, tag="offer"):
    descriptor: TransferDescriptor


Frame = Pull | Ready | Refused | Ack | Ping | Pong | Probe | ProbeOffer

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Frame)


def send_frame(sock: socket.socket, frame: Frame) -> None:
    body = _encoder.encode(frame)
    sock.sendall(_LEN.pack(len(body)) + body)


def recv_frame(sock: socket.socket) -> Frame | None:
    """The next frame, or None when the peer closed cleanly between frames."""
    head = bytearray(_LEN.size)
    if not recv_exact(sock, memoryview(head), eof_ok=True):
        return None
    (size,) = _LEN.unpack(head)
    if size > MAX_FRAME:
        raise ValueError(f"control frame of {size} bytes")
    body = bytearray(size)
    recv_exact(sock, memoryview(body))
    return _decoder.decode(body)


def recv_exact(sock: socket.socket, view: memoryview, *, eof_ok: bool = False) -> bool:
    """Fill ``view`` from the socket with no intermediate copies. False on a clean EOF before
    the first byte when ``eof_ok``; ConnectionError on EOF anywhere else."""
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            if eof_ok and got == 0:
                return False
            raise ConnectionError(f"peer closed after {got} of {len(view)} bytes")
        got += n
    return True
