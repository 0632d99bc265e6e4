"""Wire frames of the TCP request plane and a length-prefixed framing protocol.

One connection carries many concurrent calls, told apart by ``stream_id`` (chosen by the
client). Each frame is a 4-byte big-endian length followed by a msgpack array whose first
element is the frame tag. Writes are coalesced per event-loop turn: when many streams emit a
token in the same turn they leave in one ``send`` system call.
"""

from __future__ import annotations

import asyncio

import msgspec

MAX_FRAME = 256 * 1024 * 1024
"""Larger frames mean a corrupt stream (or a bug): the connection is dropped."""


class _Frame(msgspec.Struct, array_like=True, tag_field="frame"):
    """A frame's wire form: a msgpack array led by its tag (each frame sets its own)."""


class Open(_Frame, tag=0):
    stream_id: int
    key: str
    payload: bytes


class Data(_Frame, tag=1):
    stream_id: int
    payload: bytes


class End(_Frame, tag=2):
    stream_id: int


class Fail(_Frame, tag=3):
    stream_id: int
    code: str
    """``errors.InterlockError.code`` ("" for a foreign exception)."""
    message: str
    param: str | None = None


class Cancel(_Frame, tag=4):
    stream_id: int


class Ping(_Frame, tag=5):
    nonce: int
    key: str
    """Handler key to check, or "" for a connection keepalive."""


class Pong(_Frame, tag=6):
    nonce: int
    ok: bool


Frame = Open | Data | End | Fail | Cancel | Ping | Pong

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Frame)


class FramedProtocol(asyncio.Protocol):
    """Splits the byte stream into frames for ``frame_received``; ``send`` queues a frame.

    A connection may open with a preamble of fixed-size messages (the cluster handshake,
    ``protocol.handshake``): while ``expect_preamble(n)`` is pending, the next ``n`` bytes go
    to ``preamble_received`` and no frame is decoded."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._inbuf = bytearray()
        self._preamble: int | None = None
        self._outbuf = bytearray()
        self._flush_pending = False
        self._writable = asyncio.Event()
        self._writable.set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        if self._preamble is not None:
            data = self._take_preamble(data)
            if not data:
                return
        buf = self._inbuf
        buf += data
        pos, size = 0, len(buf)
        frames: list[Frame] = []
        with memoryview(buf) as view:
            while size - pos >= 4:
                length = int.from_bytes(view[pos : pos + 4], "big")
                if length > MAX_FRAME:
                    self.abort()
                    return
                if size - pos - 4 < length:
                    break
                frames.append(_decoder.decode(view[pos + 4 : pos + 4 + length]))
                pos += 4 + length
        del buf[:pos]
        for frame in frames:
            self.frame_received(frame)

    def frame_received(self, frame: Frame) -> None:
        raise NotImplementedError

    def expect_preamble(self, size: int) -> None:
        """The next ``size`` bytes are one preamble message, not frames."""
        self._preamble = size

    def preamble_received(self, message: bytes) -> None:
        raise NotImplementedError

    def send_raw(self, data: bytes) -> None:
        """Write preamble bytes at once (no frame is ever queued before the preamble ends)."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def _take_preamble(self, data: bytes) -> bytes:
        """Feed preamble messages; what follows the last one (frames) is returned."""
        buf = self._inbuf
        buf += data
        while self._preamble is not None and len(buf) >= self._preamble:
            message = bytes(buf[: self._preamble])
            del buf[: self._preamble]
            self._preamble = None
            self.preamble_received(message)
            if self.transport is None or self.transport.is_closing():
                buf.clear()
                return b""
        if self._preamble is not None:
            return b""
        rest = bytes(buf)
        buf.clear()
        return rest

    def send(self, frame: Frame) -> None:
        out = self._outbuf
        start = len(out)
        out += b"\0\0\0\0"
        _encoder.encode_into(frame, out, start + 4)
        out[start : start + 4] = (len(out) - start - 4).to_bytes(4, "big")
        if not self._flush_pending:
            self._flush_pending = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_pending = False
        if self._outbuf and self.transport is not None and not self.transport.is_closing():
            data, self._outbuf = self._outbuf, bytearray()
            self.transport.write(data)

    async def drain(self) -> None:
        """Wait while the peer is not reading (transport buffer over its high-water mark)."""
        if not self._writable.is_set():
            await self._writable.wait()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._writable.set()  # wake writers; their next send is dropped with the transport
