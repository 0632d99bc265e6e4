"""Serving one generation request over HTTP: stream it as SSE or collect it into one body.

The backend's first output is awaited before any byte is sent, so an error raised before the
first token (no worker, overloaded, engine failure) still gets its own HTTP status. After the
headers are out, an error becomes an SSE error event followed by ``[DONE]``. The first write
carries the HTTP headers too, the last the finish chunk, the usage chunk, ``[DONE]`` and the end
of the chunked body. In between, the chunks of one event-loop turn leave in one socket write
(``Coalescer``): under load a stream's outputs arrive several at a time (the workers run ahead
of the frontend), and one write per token was the frontend's largest cost.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import msgspec
from aiohttp import HttpVersion11, web

from interlock.errors import EngineError, InterlockError, ServiceError
from interlock.frontend.assembler import OutputAssembler
from interlock.frontend.backend import RequestContext
from interlock.frontend.metrics import FrontendMetrics
from interlock.frontend.responses import DONE, ChatFormatter, CompletionFormatter, error_body, sse
from interlock.protocol import GenerateOutput, TokenLogprobs

log = logging.getLogger(__name__)
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
_encode = msgspec.json.Encoder().encode


@dataclass
class Generation:
    """Everything one request needs once its GenerateRequest is sent."""

    stream: AsyncIterator[GenerateOutput]
    ctx: RequestContext
    assembler: OutputAssembler
    formatter: ChatFormatter | CompletionFormatter
    model: str
    metrics: FrontendMetrics
    started: float
    last_token_at: float = 0.0

    async def next_output(self) -> GenerateOutput:
        try:
            out = await anext(self.stream)
        except StopAsyncIteration:
            raise EngineError("the backend ended the stream without a finish reason") from None
        self._observe(out)
        return out

    async def close(self) -> None:
        """Close the backend stream; before the end this aborts the request on its worker."""
        aclose = getattr(self.stream, "aclose", None)
        if aclose is not None:
            await aclose()

    def _observe(self, out: GenerateOutput) -> None:
        n = len(out.token_ids)
        if not n:
            return
        now = perf_counter()
        labels = (self.model,)
        if self.last_token_at == 0.0:
            self.metrics.ttft.observe(now - self.started, labels)
            if n > 1:
                self.metrics.itl.observe(0.0, labels, n - 1)
        else:
            self.metrics.itl.observe((now - self.last_token_at) / n, labels, n)
        self.last_token_at = now

    def finish_metrics(self) -> None:
        labels = (self.model,)
        a = self.assembler
        self.metrics.e2e.observe(perf_counter() - self.started, labels)
        self.metrics.prompt_tokens.inc(labels, a.prompt_tokens)
        self.metrics.cached_tokens.inc(labels, a.cached_tokens)
        self.metrics.cache_miss_tokens.inc(labels, a.prompt_tokens - a.cached_tokens)
        self.metrics.completion_tokens.inc(labels, a.completion_tokens)


class SSEResponse(web.StreamResponse):
    # aiohttp's private switch: hold the headers and send them with the first chunk, one
    # socket write fewer per request (an unknown attribute in another aiohttp is harmless).
    _send_headers_immediately = False


class Coalescer:
    """SSE bytes of one chunked HTTP/1.1 response, written once per event-loop turn.

    ``add`` only buffers and schedules ``flush`` for the end of the turn, so the chunks a stream
    gets without waiting leave in one write (one HTTP chunk), and a lone chunk leaves as soon as
    the stream waits for its next output. Written straight to the transport, after aiohttp has
    sent the headers (the response's first write goes through aiohttp) and before its
    ``write_eof``. There is no drain: what a slow client has not read
    stays in the transport's buffer, bounded by the response's size (``max_tokens``). At the end
    ``take`` hands what is pending to ``write_eof``, so it leaves with the end of the body."""

    __slots__ = ("_transport", "_parts", "_scheduled")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._parts: list[bytes] = []
        self._scheduled = False

    def add(self, data: bytes) -> None:
        if self._transport.is_closing():
            raise ConnectionResetError("the client closed the connection")
        self._parts.append(data)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self._scheduled = False
        data = self.take()
        if data and not self._transport.is_closing():
            self._transport.write(b"%x\r\n%b\r\n" % (len(data), data))

    def take(self) -> bytes:
        """What is pending, now no longer pending."""
        data = b"".join(self._parts)
        self._parts.clear()
        return data


async def stream_sse(
    request: web.Request, gen: Generation, first: GenerateOutput, include_usage: bool
) -> web.StreamResponse:
    resp = SSEResponse(headers={**SSE_HEADERS, **gen.ctx.response_headers})
    chunked = request.version >= HttpVersion11
    if chunked:
        resp.enable_chunked_encoding()  # the framing Coalescer writes
    await resp.prepare(request)
    coalescer: Coalescer | None = None
    out = first
    try:
        while True:
            delta = gen.assembler.push(out)
            if delta.finish_reason is not None:
                tail = gen.formatter.usage_chunk(gen.assembler) if include_usage else b""
                pending = coalescer.take() if coalescer is not None else b""
                await resp.write_eof(pending + gen.formatter.chunk(delta) + tail + DONE)
                gen.finish_metrics()
                return resp
            if delta.text or delta.logprobs is not None:
                data = gen.formatter.chunk(delta)
                if coalescer is not None:
                    coalescer.add(data)
                else:
                    await resp.write(data)  # the headers go with it
                    transport = request.transport
                    if chunked and transport is not None:
                        coalescer = Coalescer(transport)  # type: ignore[arg-type]  # uvloop's
            out = await gen.next_output()
    except ConnectionResetError:
        pass  # the client went away; closing the stream aborts the request
    except InterlockError as exc:
        pending = coalescer.take() if coalescer is not None else b""
        await resp.write_eof(pending + sse(error_body(exc)) + DONE)
    except Exception:  # the headers are out: a new response cannot be sent, so report in-band
        log.exception("unexpected error while streaming %s", gen.ctx.request_id)
        pending = coalescer.take() if coalescer is not None else b""
        await resp.write_eof(pending + sse(error_body(ServiceError("internal server error"))) + DONE)
    return resp


async def collect(gen: Generation, first: GenerateOutput) -> web.Response:
    parts: list[str] = []
    logprobs: list[TokenLogprobs] | None = None
    out = first
    while True:
        delta = gen.assembler.push(out)
        parts.append(delta.text)
        if delta.logprobs is not None:
            logprobs = logprobs if logprobs is not None else []
            logprobs.extend(delta.logprobs)
        if delta.finish_reason is not None:
            break
        out = await gen.next_output()
    gen.finish_metrics()
    body: dict[str, Any] = gen.formatter.response("".join(parts), logprobs, gen.assembler)
    return web.Response(body=_encode(body), content_type="application/json", headers=gen.ctx.response_headers)
