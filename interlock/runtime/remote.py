"""Running a handler for one call, and carrying its failure across the wire.

Shared by every request-plane server so that cancellation and error reporting behave the
same in-process, over TCP and over NATS.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import interlock.errors as errors_module
from interlock.errors import InterlockError, TransportError
from interlock.runtime.interfaces import CallContext, Handler


def describe_error(exc: BaseException) -> tuple[str, str]:
    """``(type, message)`` to send to the client."""
    if isinstance(exc, InterlockError):
        return type(exc).__name__, exc.message
    return type(exc).__name__, f"{type(exc).__name__}: {exc}"


def remote_error(type_name: str, message: str) -> InterlockError:
    """Rebuild an error sent by ``describe_error``: our own error classes keep their class
    (so a RequestError stays a 4xx); anything else is a TransportError."""
    cls = getattr(errors_module, type_name, None)
    if isinstance(cls, type) and issubclass(cls, InterlockError):
        try:
            return cls(message)
        except TypeError:  # a subclass with a different constructor: keep the family
            pass
    return TransportError(f"remote handler failed: {message}")


async def run_handler(
    handler: Handler,
    payload: bytes,
    ctx: CallContext,
    send: Callable[[bytes], Awaitable[None]],
    end: Callable[[], Awaitable[None]],
    fail: Callable[[str, str], Awaitable[None]],
) -> None:
    """Drive ``handler`` to completion, forwarding chunks with ``send``.

    Cancellation of the calling task (client gone) reaches the handler's generator through
    ``aclose``, even when the task is parked in ``send`` behind backpressure.
    """
    chunks = handler(payload, ctx)
    try:
        try:
            async for chunk in chunks:
                await send(chunk)
        finally:
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await aclose()
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # any handler failure goes to the client, never kills the server
        await fail(*describe_error(exc))
        return
    await end()
