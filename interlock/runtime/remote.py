"""Running a handler for one call, and carrying its failure across the wire.

Shared by every request-plane server so that cancellation and error reporting behave the
same in-process, over TCP and over NATS.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from interlock.errors import InterlockError, TransportError, rebuild
from interlock.runtime.interfaces import CallContext, Handler

WireError = tuple[str, str, str | None]
"""``(code, message, param)``: a handler's failure as it crosses the wire."""


def describe_error(exc: BaseException) -> WireError:
    """What to send the client: our own errors by code (their ``param`` kept); anything else
    with no code, so the client sees a TransportError naming it."""
    if isinstance(exc, InterlockError):
        return exc.code, exc.message, exc.param
    return "", f"remote handler failed: {type(exc).__name__}: {exc}", None


def remote_error(code: str, message: str, param: str | None = None) -> InterlockError:
    """Rebuild an error sent by ``describe_error`` (``errors.rebuild``; TransportError when
    the code is not ours)."""
    return rebuild(code, message, param, unknown=TransportError)


async def run_handler(
    handler: Handler,
    payload: bytes,
    ctx: CallContext,
    send: Callable[[bytes], Awaitable[None]],
    end: Callable[[], Awaitable[None]],
    fail: Callable[[str, str, str | None], Awaitable[None]],
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
