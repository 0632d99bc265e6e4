"""Serving one generation request over HTTP: stream it as SSE or collect it into one body.

The backend's first output is awaited before any byte is sent, so an error raised before the
first token (no worker, overloaded, engine failure) still gets its own HTTP status. After the
headers are out, an error becomes an SSE error event followed by ``[DONE]``. The first write
carries the HTTP headers too, the last the finish chunk, the usage chunk, ``[DONE]`` and the end
of the chunked body. In between, the chunks of one event-loop turn leave in one socket write
(``Coalescer``): under load a stream's outputs arrive several at a time (the workers run ahead
of the frontend), and one write per token was the frontend's largest cost.

A client that reads a stream slowly, or never, must not make the frontend buffer the output:
what it has not read is held to ``max_stream_buffer_bytes`` (the transport's high-water mark; an
HTTP/1.0 stream, written through aiohttp, to aiohttp's own 64 KiB).
Past it the stream stops pulling outputs and waits for the client to read the buffer down; if it
has not within ``stream_stall_timeout_s`` the stream is aborted: the connection is reset (the
buffer dropped, not flushed) and the backend stream closed, which aborts the request on its
worker, with the reason in the log and ``interlock_http_shed_total{reason="stream_stalled"}``.
Waiting alone (back-pressure without an end) was the other choice, and the worse one: the
request plane has no flow control, so a paused stream still holds its worker's KV blocks and
batch slot, and its outputs pile up in the frontend's channel instead of the socket's buffer;
a client that never reads would hold all of that for as long as it keeps the connection. The
stall timeout bounds a stall's cost by the token rate times the timeout, and a reader that only
lags (a slow link, a paused tab) still gets every token.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import msgspec
from aiohttp import HttpVersion11, web
from aiohttp.abc import AbstractStreamWriter

from interlock.errors import EngineError, InterlockError, ServiceError
from interlock.frontend.assembler import OutputAssembler
from interlock.frontend.backend import RequestContext
from interlock.frontend.metrics import FrontendMetrics
from interlock.frontend.responses import DONE, ChatFormatter, CompletionFormatter, error_body, sse, usage
from interlock.frontend.responses_api import ResponsesFormatter
from interlock.protocol import GenerateOutput, TokenLogprobs

log = logging.getLogger(__name__)
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
_encode = msgspec.json.Encoder().encode


@dataclass
class Generation:
    """Everything one choice needs once its GenerateRequest is sent."""

    stream: AsyncIterator[GenerateOutput]
    ctx: RequestContext
    assembler: OutputAssembler
    formatter: ChatFormatter | CompletionFormatter | ResponsesFormatter
    model: str
    metrics: FrontendMetrics
    started: float
    last_token_at: float = 0.0
    first_token_at: float = 0.0

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
            self.first_token_at = now
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
        self.metrics.prompt_lengths.observe(a.prompt_tokens, labels)
        self.metrics.completion_lengths.observe(a.completion_tokens, labels)
        self.metrics.finished.inc((self.model, a.finish_reason or "abort"))


class Choices:
    """The choices of one request (``n`` copies of each prompt), their outputs in one sequence.

    One choice is read straight from its stream. Several are each pumped by a task into one
    queue, in the order their outputs arrive. A copy is sent only once its prompt's first choice
    has its first token: the prompt is then in that worker's prefix cache, and the copy, routed
    with the same route key, reuses it (one prefill for ``n`` choices)."""

    def __init__(
        self,
        gens: list[Generation],
        prompts: int,
        copy_of: dict[int, Callable[[], AsyncIterator[GenerateOutput]]],
    ) -> None:
        """``gens``: the first choice of each prompt first (``prompts`` of them), then copies,
        whose streams ``copy_of[i]`` opens once the first choice of the same prompt, gen
        ``i % prompts``, has produced its first output."""
        self.gens = gens
        self.prompts = prompts
        self._queue: asyncio.Queue[tuple[Generation, GenerateOutput | BaseException]] = asyncio.Queue()
        self._first = [asyncio.Event() for _ in range(prompts)]
        self._tasks = (
            [asyncio.create_task(self._pump(i, copy_of.get(i))) for i in range(len(gens))]
            if len(gens) > 1
            else []
        )

    async def next(self) -> tuple[Generation, GenerateOutput]:
        if not self._tasks:
            gen = self.gens[0]
            return gen, await gen.next_output()
        gen, out = await self._queue.get()
        if isinstance(out, BaseException):
            raise out
        return gen, out

    async def _pump(self, i: int, open_copy: Callable[[], AsyncIterator[GenerateOutput]] | None) -> None:
        gen = self.gens[i]
        try:
            if open_copy is not None:
                await self._first[i % self.prompts].wait()
                gen.stream = open_copy()
            while True:
                out = await gen.next_output()
                if i < self.prompts:
                    self._first[i].set()
                self._queue.put_nowait((gen, out))
                if out.finished or out.error is not None:
                    return
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # reaches the reader, which ends the whole request
            self._queue.put_nowait((gen, exc))

    def usage(self) -> dict[str, Any]:
        return usage([g.assembler for g in self.gens], self.prompts)

    @property
    def completion_tokens(self) -> int:
        return sum(g.assembler.completion_tokens for g in self.gens)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for gen in self.gens:
            await gen.close()


class SSEResponse(web.StreamResponse):
    # aiohttp's private switch: hold the headers and send them with the first chunk, one
    # socket write fewer per request (an unknown attribute in another aiohttp is harmless).
    _send_headers_immediately = False


@dataclass(frozen=True)
class StreamLimits:
    max_buffer_bytes: int
    """Unread bytes a stream may leave in its connection's buffer before it waits."""
    stall_timeout_s: float
    """How long it waits for the client to read before the stream is aborted."""


class StreamStalled(Exception):
    """The client did not read its stream for ``stall_timeout_s`` with the buffer full."""


class Coalescer:
    """SSE bytes of one chunked HTTP/1.1 response, written once per event-loop turn.

    ``add`` only buffers and schedules ``flush`` for the end of the turn, so the chunks a stream
    gets without waiting leave in one write (one HTTP chunk), and a lone chunk leaves as soon as
    the stream waits for its next output. Written straight to the transport, after aiohttp has
    sent the headers (the response's first write goes through aiohttp) and before its
    ``write_eof``. The transport's high-water mark is the stream's buffer limit: past it the
    transport pauses aiohttp's protocol, and ``wait_for_reader`` waits on aiohttp's drain until
    the client has read the buffer down to a quarter of it. At the end ``take`` hands what is
    pending to ``write_eof``, so it leaves with the end of the body."""

    __slots__ = ("_transport", "_parts", "_pending", "_scheduled")

    def __init__(self, transport: asyncio.Transport, max_buffer_bytes: int) -> None:
        self._transport = transport
        self._parts: list[bytes] = []
        self._pending = 0
        self._scheduled = False
        transport.set_write_buffer_limits(high=max_buffer_bytes)

    def add(self, data: bytes) -> None:
        if self._transport.is_closing():
            raise ConnectionResetError("the client closed the connection")
        self._parts.append(data)
        self._pending += len(data)
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
        self._pending = 0
        return data

    def backlog(self) -> int:
        """Bytes the client has not read: pending here and in the transport's buffer."""
        return self._pending + self._transport.get_write_buffer_size()

    async def wait_for_reader(self, writer: AbstractStreamWriter, limits: StreamLimits) -> None:
        """Flush, then wait until the client has read the buffer down, or StreamStalled."""
        self.flush()
        waiting = self._transport.get_write_buffer_size()
        await _within(limits, writer.drain(), waiting)


async def stream_sse(
    request: web.Request,
    choices: Choices,
    first: tuple[Generation, GenerateOutput],
    include_usage: bool,
    limits: StreamLimits,
) -> web.StreamResponse:
    lead = choices.gens[0]
    resp = SSEResponse(headers={**SSE_HEADERS, **lead.ctx.response_headers})
    chunked = request.version >= HttpVersion11
    if chunked:
        resp.enable_chunked_encoding()  # the framing Coalescer writes
    await resp.prepare(request)
    try:
        await _stream(request, resp, choices, first, include_usage, limits)
    except ConnectionResetError:
        pass  # the client went away; closing the stream aborts the request
    except StreamStalled as exc:
        log.warning("stream %s aborted: %s", lead.ctx.request_id, exc)
        lead.metrics.shed.inc(("stream_stalled",))
        transport = request.transport
        if transport is not None:
            transport.abort()  # close() would wait to flush what the client never reads
    return resp


async def _stream(
    request: web.Request,
    resp: web.StreamResponse,
    choices: Choices,
    first: tuple[Generation, GenerateOutput],
    include_usage: bool,
    limits: StreamLimits,
) -> None:
    chunked = request.version >= HttpVersion11
    coalescer: Coalescer | None = None
    gen, out = first
    unfinished = len(choices.gens)
    try:
        while True:
            delta = gen.assembler.push(out)
            data = b""
            if delta.finish_reason is not None:
                gen.finish_metrics()
                unfinished -= 1
                data = gen.formatter.chunk(delta)
                if not unfinished:
                    tail = gen.formatter.usage_chunk(choices.usage()) if include_usage else b""
                    pending = coalescer.take() if coalescer is not None else b""
                    await _within(limits, resp.write_eof(pending + data + tail + DONE))
                    return
            elif delta.text or delta.logprobs is not None:
                data = gen.formatter.chunk(delta)
            if data:
                if coalescer is not None:
                    coalescer.add(data)
                    if coalescer.backlog() > limits.max_buffer_bytes:
                        await coalescer.wait_for_reader(request.writer, limits)
                elif chunked:  # the first chunk, with the headers: too small for aiohttp to drain
                    await resp.write(data)
                    transport = request.transport
                    if transport is not None:
                        coalescer = Coalescer(transport, limits.max_buffer_bytes)  # type: ignore[arg-type]  # uvloop's
                else:  # HTTP/1.0: every chunk through aiohttp, which waits for the reader past 64 KiB
                    await _within(limits, resp.write(data))
            gen, out = await choices.next()
    except (ConnectionResetError, StreamStalled):
        raise  # nothing more can reach the client: stream_sse ends it
    except InterlockError as exc:
        pending = coalescer.take() if coalescer is not None else b""
        await _within(limits, resp.write_eof(pending + sse(error_body(exc)) + DONE))
    except Exception:  # the headers are out: a new response cannot be sent, so report in-band
        log.exception("unexpected error while streaming %s", gen.ctx.request_id)
        pending = coalescer.take() if coalescer is not None else b""
        error = sse(error_body(ServiceError("internal server error")))
        await _within(limits, resp.write_eof(pending + error + DONE))


async def _within(limits: StreamLimits, write: Awaitable[None], waiting: int | None = None) -> None:
    """``write`` (which waits for the client to read when the buffer is full), or StreamStalled."""
    try:
        async with asyncio.timeout(limits.stall_timeout_s):
            await write
    except TimeoutError:
        unread = f"{waiting} bytes unread" if waiting is not None else "its buffer full"
        raise StreamStalled(
            f"the client left {unread} for {limits.stall_timeout_s} s (stream_stall_timeout_s; "
            f"max_stream_buffer_bytes is {limits.max_buffer_bytes})"
        ) from None


@dataclass(frozen=True)
class BestOf:
    """``best_of``: of each prompt's generated choices, keep the ``keep`` with the highest mean
    log probability per token (OpenAI's rule), numbered anew; ``logprobs``: whether the client
    asked for them (they were computed for the ranking either way)."""

    keep: int
    logprobs: bool


async def collect(
    choices: Choices, first: tuple[Generation, GenerateOutput], best_of: BestOf | None = None
) -> web.Response:
    parts: dict[int, list[str]] = {id(g): [] for g in choices.gens}
    logprobs: dict[int, list[TokenLogprobs] | None] = {id(g): None for g in choices.gens}
    prompts: dict[int, tuple[TokenLogprobs, ...] | None] = {id(g): None for g in choices.gens}
    unfinished = len(choices.gens)
    gen, out = first
    while True:
        delta = gen.assembler.push(out)
        parts[id(gen)].append(delta.text)
        if delta.logprobs is not None:
            logprobs[id(gen)] = (logprobs[id(gen)] or []) + list(delta.logprobs)
        if delta.prompt_logprobs is not None:
            prompts[id(gen)] = delta.prompt_logprobs
        if delta.finish_reason is not None:
            gen.finish_metrics()
            unfinished -= 1
            if not unfinished:
                break
        gen, out = await choices.next()
    kept = sorted(choices.gens, key=lambda g: g.formatter.index)
    if best_of is not None:
        kept = _best(choices, logprobs, best_of.keep)
        if not best_of.logprobs:
            logprobs = dict.fromkeys(logprobs)
    bodies = [
        g.formatter.choice("".join(parts[id(g)]), logprobs[id(g)], g.assembler.finish_reason, prompts[id(g)])
        for g in kept
    ]
    lead = choices.gens[0]
    body = lead.formatter.body(bodies, choices.usage())
    return web.Response(
        body=_encode(body), content_type="application/json", headers=lead.ctx.response_headers
    )


def _best(choices: Choices, logprobs: dict[int, list[TokenLogprobs] | None], keep: int) -> list[Generation]:
    """Each prompt's ``keep`` best choices, their formatters renumbered prompt by prompt."""
    scores = [mean_logprob(logprobs[id(g)]) for g in choices.gens]
    kept = [choices.gens[i] for i in best_of_positions(scores, choices.prompts, keep)]
    for index, gen in enumerate(kept):
        gen.formatter.index = index
    return kept


def mean_logprob(found: list[TokenLogprobs] | None) -> float:
    return sum(lp.logprob for lp in found) / len(found) if found else float("-inf")


def best_of_positions(scores: list[float], prompts: int, keep: int) -> list[int]:
    """The positions of each prompt's ``keep`` highest scores, prompt by prompt, best first
    (copy j of prompt p sits at ``j * prompts + p``; ties keep the earlier copy)."""
    out: list[int] = []
    for p in range(prompts):
        group = range(p, len(scores), prompts)
        out.extend(sorted(group, key=lambda i: -scores[i])[:keep])
    return out
