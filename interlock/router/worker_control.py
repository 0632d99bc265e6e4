"""The client side of a worker's control endpoint (``engine/control.py`` serves it): one call,
one ``ControlReply``. Used by the disaggregated flow (link checks), the builder (role changes)
and ``interlock worker control``."""

from __future__ import annotations

import contextlib

import msgspec

from interlock.errors import TransportError
from interlock.protocol.control import ControlReply, ControlRequest
from interlock.runtime.interfaces import RequestPlane

_encode = msgspec.msgpack.Encoder().encode
_decode_reply = msgspec.msgpack.Decoder(ControlReply).decode


async def control_call(requests: RequestPlane, address: str, req: ControlRequest) -> ControlReply:
    """One control call to a worker (``InstanceInfo.metadata["control_address"]``)."""
    stream = requests.stream(address, _encode(req))
    async with contextlib.aclosing(stream):
        async for chunk in stream:
            return _decode_reply(chunk)
    raise TransportError(f"no control reply from {address}")
