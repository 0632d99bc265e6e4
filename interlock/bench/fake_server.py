"""A small OpenAI-compatible streaming server with known, injected delays (the bench's fake).

It answers ``/v1/chat/completions`` and ``/v1/completions`` (streaming or not) and
``/v1/models``. Each request streams ``max_tokens`` tokens (common English words, one token each
for usual tokenizers): a role-only chunk at once (chat), the first content chunk ``ttft_s`` after
arrival, then one chunk every ``tokens_per_chunk * itl_s``, each carrying ``tokens_per_chunk``
tokens; then a usage chunk when asked for, then ``[DONE]``. Send times are absolute
(arrival + offset) so sleep overshoot does not accumulate over a stream.

Injected faults, by the request's 1-based arrival number ``k``: ``fail_every=((n, status),)``
answers status ``status`` when ``n`` divides ``k`` (first match wins); ``stream_error_every``
sends an error event mid-stream; ``drop_every`` closes the connection mid-stream.

``GET /metrics`` serves a few of Interlock's metrics in Prometheus text format, counted from
what it served (requests by finish reason, prompt tokens, the injected TTFT as prefill time);
``metrics=False`` answers it 404, as a server without metrics would.

Tests and the cross-check use it; run it alone with ``interlock bench fake-server --port 8000``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

WORDS = (" the", " of", " and", " to", " in", " is", " was", " for", " on", " are", " with", " as")


@dataclass(frozen=True)
class FakeTiming:
    ttft_s: float = 0.05
    itl_s: float = 0.01
    tokens_per_chunk: int = 1
    fail_every: tuple[tuple[int, int], ...] = ()
    stream_error_every: int = 0
    drop_every: int = 0


@dataclass(frozen=True)
class Received:
    t: float
    """``time.perf_counter()`` when the request arrived."""
    path: str
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class FakeOpenAIServer:
    timing: FakeTiming = field(default_factory=FakeTiming)
    model: str = "fake-model"
    host: str = "127.0.0.1"
    port: int = 0
    received: list[Received] = field(default_factory=list)
    metrics: bool = True
    _finished: dict[str, int] = field(default_factory=dict)
    _prompt_tokens: int = 0
    _prefill_s: float = 0.0
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._completion)
        app.router.add_post("/v1/completions", self._completion)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "fake"}]}
        )

    async def _metrics(self, request: web.Request) -> web.Response:
        if not self.metrics:
            raise web.HTTPNotFound()
        served = sum(self._finished.values()) - self._finished.get("error", 0)
        fleet = request.query.get("scope") == "fleet"  # the workers' figures carry their name
        worker, bucket = (
            ('{worker="fake-0"}', '{worker="fake-0",le="+Inf"}') if fleet else ("", '{le="+Inf"}')
        )
        lines = ["# TYPE interlock_requests_total counter"]
        lines += [
            f'interlock_requests_total{{model="{self.model}",finish_reason="{reason}"}} {count}'
            for reason, count in sorted(self._finished.items())
        ]
        lines += [
            "# TYPE interlock_prompt_tokens_total counter",
            f'interlock_prompt_tokens_total{{model="{self.model}"}} {self._prompt_tokens}',
            "# TYPE interlock_prompt_tokens_cached_total counter",
            f'interlock_prompt_tokens_cached_total{{model="{self.model}"}} 0',
            "# TYPE interlock_router_migrations_total counter",
            "interlock_router_migrations_total 0",
            "# TYPE interlock_engine_prefill_time_seconds histogram",
            f"interlock_engine_prefill_time_seconds_bucket{bucket} {served}",
            f"interlock_engine_prefill_time_seconds_sum{worker} {self._prefill_s}",
            f"interlock_engine_prefill_time_seconds_count{worker} {served}",
            "# TYPE interlock_engine_preemptions_total counter",
            f"interlock_engine_preemptions_total{worker} 0",
        ]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    def _fault(self, k: int) -> int | None:
        return next((status for n, status in self.timing.fail_every if _every(n, k)), None)

    async def _completion(self, request: web.Request) -> web.StreamResponse:
        arrived = time.perf_counter()
        body = await request.json()
        self.received.append(Received(arrived, request.path, body, dict(request.headers)))
        k = len(self.received)
        if (status := self._fault(k)) is not None:
            self._finished["error"] = self._finished.get("error", 0) + 1
            return web.json_response(
                {"error": {"message": "injected fault", "type": "fake", "code": status}}, status=status
            )
        chat = request.path.endswith("/chat/completions")
        n = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        self._finished["length"] = self._finished.get("length", 0) + 1
        self._prompt_tokens += _usage(body, n)["prompt_tokens"]
        self._prefill_s += self.timing.ttft_s
        if not body.get("stream"):
            await asyncio.sleep(self.timing.ttft_s + (n - 1) * self.timing.itl_s)
            return web.json_response(self._full(chat, n, body))
        return await self._stream(request, body, chat, n, arrived, k)

    async def _stream(
        self, request: web.Request, body: dict[str, Any], chat: bool, n: int, arrived: float, k: int
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        if chat:
            await _send(resp, self._chunk(chat, "", None, role=True))
        per, sent, chunk_no = max(1, self.timing.tokens_per_chunk), 0, 0
        while sent < n:
            count = min(per, n - sent)
            await _sleep_until(arrived + self.timing.ttft_s + (sent + count - 1) * self.timing.itl_s)
            if chunk_no == 1 and _every(self.timing.stream_error_every, k):
                await _send(resp, {"error": {"message": "injected stream error", "type": "fake"}})
                return resp
            if chunk_no == 1 and _every(self.timing.drop_every, k):
                assert request.transport is not None
                request.transport.close()
                return resp
            text = "".join(WORDS[(sent + i) % len(WORDS)] for i in range(count))
            sent += count
            chunk_no += 1
            await _send(resp, self._chunk(chat, text, "length" if sent >= n else None))
        if (body.get("stream_options") or {}).get("include_usage"):
            await _send(
                resp,
                {
                    "id": "fake",
                    "object": "chunk",
                    "model": self.model,
                    "choices": [],
                    "usage": _usage(body, n),
                },
            )
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    def _chunk(self, chat: bool, text: str, finish: str | None, role: bool = False) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": finish}
        if chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {"content": text}
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return {
            "id": "fake",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [choice],
        }

    def _full(self, chat: bool, n: int, body: dict[str, Any]) -> dict[str, Any]:
        text = "".join(WORDS[i % len(WORDS)] for i in range(n))
        choice: dict[str, Any] = (
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
            if chat
            else {"index": 0, "text": text, "finish_reason": "length"}
        )
        return {
            "id": "fake",
            "object": "chat.completion" if chat else "text_completion",
            "model": self.model,
            "choices": [choice],
            "usage": _usage(body, n),
        }


def _usage(body: dict[str, Any], n: int) -> dict[str, Any]:
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        prompt_tokens = len(prompt)
    else:
        text = (
            prompt
            if isinstance(prompt, str)
            else " ".join(str(m.get("content", "")) for m in body.get("messages", ()))
        )
        prompt_tokens = len(text.split())
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": n,
        "total_tokens": prompt_tokens + n,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


def _every(n: int, k: int) -> bool:
    """Request ``k`` (1-based) is one of every ``n`` (0: none)."""
    return n > 0 and k % n == 0


async def _send(resp: web.StreamResponse, event: dict[str, Any]) -> None:
    await resp.write(b"data: " + json.dumps(event).encode() + b"\n\n")


async def _sleep_until(t: float) -> None:
    delay = t - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="interlock bench fake-server", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--model", default="fake-model")
    parser.add_argument("--ttft-ms", type=float, default=50.0)
    parser.add_argument("--itl-ms", type=float, default=10.0)
    parser.add_argument("--tokens-per-chunk", type=int, default=1)
    args = parser.parse_args(argv)
    timing = FakeTiming(
        ttft_s=args.ttft_ms / 1000, itl_s=args.itl_ms / 1000, tokens_per_chunk=args.tokens_per_chunk
    )
    server = FakeOpenAIServer(timing, model=args.model, host=args.host, port=args.port)

    async def serve() -> None:
        print(f"fake OpenAI server on {await server.start()}", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await server.stop()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
