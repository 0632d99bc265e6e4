"""Reading a request body under three rules: a size cap, a deadline and a minimum rate.

The deadline (``body_timeout_s``) alone let a slow body hold its connection for the whole
timeout while sending a byte now and then, so a crowd of them kept every connection busy. The
minimum rate closes that: after a grace period (``body_grace_s``, for latency and a slow start)
the body must have arrived at ``min_body_rate`` bytes a second on average since its head did,
which any real client meets by orders of magnitude and a trickle does not. The rule is one pure
function (``body_deadline``): the time by which the next byte must arrive, given what has.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from aiohttp import web

from interlock.errors import InvalidRequest, RequestTimeout


class BodyTooLarge(InvalidRequest):
    status = 413


@dataclass(frozen=True)
class BodyRules:
    max_bytes: int
    timeout_s: float
    min_rate: int
    """Bytes a second the body must average after ``grace_s``; 0: no rate rule."""
    grace_s: float


def body_deadline(rules: BodyRules, started: float, received: int) -> tuple[float, str]:
    """When the next byte is due (on ``started``'s clock), and the limit that sets it."""
    deadline, limit = started + rules.timeout_s, "body_timeout_s"
    if rules.min_rate:
        by_rate = started + rules.grace_s + received / rules.min_rate
        if by_rate < deadline:
            deadline, limit = by_rate, "min_body_rate"
    return deadline, limit


async def read_body(request: web.Request, rules: BodyRules) -> bytes:
    """The whole body, or BodyTooLarge (413) / RequestTimeout (408) naming the broken rule
    (ConnectionResetError if the connection is gone)."""
    too_large = BodyTooLarge(f"request body larger than {rules.max_bytes} bytes (max_body_bytes)")
    if (request.content_length or 0) > rules.max_bytes:
        raise too_large
    if request.content.is_eof():  # the whole body came with the head: nothing left to wait for
        body = await request.content.read()
        if len(body) > rules.max_bytes:
            raise too_large
        return body
    loop = asyncio.get_running_loop()
    started = loop.time()
    parts: list[bytes] = []
    received = 0
    while True:
        if request.transport is None:  # closed (evicted, say) before its handler got here
            raise ConnectionResetError("the connection closed while its body was read")
        deadline, limit = body_deadline(rules, started, received)
        try:
            async with asyncio.timeout_at(deadline):
                chunk = await request.content.readany()
        except TimeoutError:
            raise _timeout(rules, limit) from None
        if not chunk:
            return b"".join(parts)
        received += len(chunk)
        if received > rules.max_bytes:
            raise too_large
        parts.append(chunk)


def _timeout(rules: BodyRules, limit: str) -> RequestTimeout:
    if limit == "min_body_rate":
        return RequestTimeout(
            f"the request body arrived slower than {rules.min_rate} bytes/s after the first "
            f"{rules.grace_s} s (min_body_rate)"
        )
    return RequestTimeout(f"the request body did not arrive within {rules.timeout_s} s (body_timeout_s)")
