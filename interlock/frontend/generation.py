"""Serving one generation request over HTTP: stream it as SSE or collect it into one body.

The backend's first output is awaited before any byte is sent, so an error raised before the
first token (no worker, overloaded, engine failure) still gets its own HTTP status. After the
headers are out, an error becomes an SSE error event followed by ``[DONE]``. Each output chunk is
one socket write: the first carries the HTTP headers too, the last the finish chunk, the usage
chunk, ``[DONE]`` and the end of the chunked body.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import msgspec
from aiohttp import web

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
        self.metrics.completion_tokens.inc(labels, a.completion_tokens)


class SSEResponse(web.StreamResponse):
    # aiohttp's private switch: hold the headers and send them with the first chunk, one
    # socket write fewer per request (an unknown attribute in another aiohttp is harmless).
    _send_headers_immediately = False


async def stream_sse(
    request: web.Request, gen: Generation, first: GenerateOutput, include_usage: bool
) -> web.StreamResponse:
    resp = SSEResponse(headers={**SSE_HEADERS, **gen.ctx.response_headers})
    await resp.prepare(request)
    out = first
    try:
        while True:
            delta = gen.assembler.push(out)
            if delta.finish_reason is not None:
                tail = gen.formatter.usage_chunk(gen.assembler) if include_usage else b""
                await resp.write_eof(gen.formatter.chunk(delta) + tail + DONE)
                gen.finish_metrics()
                return resp
            if delta.text or delta.logprobs is not None:
                await resp.write(gen.formatter.chunk(delta))
            out = await gen.next_output()
    except ConnectionResetError:
        pass  # the client went away; closing the stream aborts the request
    except InterlockError as exc:
        await resp.write_eof(sse(error_body(exc)) + DONE)
    except Exception:  # the headers are out: a new response cannot be sent, so report in-band
        log.exception("unexpected error while streaming %s", gen.ctx.request_id)
        await resp.write_eof(sse(error_body(ServiceError("internal server error"))) + DONE)
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
