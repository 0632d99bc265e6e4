"""One streaming request to an OpenAI-compatible endpoint, timed.

Timing rules (all clocks are ``time.perf_counter``):

* the request's clock starts right before the POST is issued;
* an SSE line is timestamped when ``readline`` hands it over, before it is parsed;
* TTFT is the time of the first chunk that carries output text (a chat chunk holding only
  the ``role`` does not count); a chunk is a *content chunk* when its text is non-empty;
* ``chunk_times_s`` holds every content chunk's time since the request started.

Token counts: ``output_tokens_stream`` counts content chunks (servers normally send one token
per chunk); ``output_tokens_usage`` is ``completion_tokens`` from the final usage chunk
(``stream_options.include_usage``). When a server packs several tokens into one chunk, the two
differ; the per-request ITL then uses the usage count (see ``stats``), which is why both kept.

Failures are recorded, never raised: ``error`` is a short kind (``http_503``, ``timeout``,
``connect_error``, ``disconnected``, ``stream_error``, ``incomplete``, ``empty``, ``cancelled``).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
import msgspec

from interlock.bench.prompts import Prompt

Api = Literal["chat", "completions"]
_decode = msgspec.json.Decoder()
_encode = msgspec.json.Encoder()


@dataclass(frozen=True)
class Endpoint:
    url: str
    """Base URL, e.g. ``http://127.0.0.1:8000`` (``/v1`` is added)."""
    model: str
    api: Api = "chat"
    send_token_ids: bool = False
    """Completions only: send ``prompt`` as a list of token ids."""
    ignore_eos: bool = True
    """Ask for exactly ``max_tokens`` (vLLM/Interlock extension; servers that lack it ignore it)."""
    request_timeout_s: float = 600.0
    extra_body: dict[str, Any] = field(default_factory=dict)

    @property
    def path(self) -> str:
        base = self.url.rstrip("/")
        base = base if base.endswith("/v1") else base + "/v1"
        return base + ("/chat/completions" if self.api == "chat" else "/completions")


@dataclass
class RequestRecord:
    index: int
    start_s: float
    """Send time, seconds since the run started."""
    scheduled_s: float | None = None
    """When the schedule wanted it sent (rate and trace modes)."""
    input_tokens: int = 0
    max_tokens: int = 0
    ttft_s: float | None = None
    e2e_s: float | None = None
    chunk_times_s: list[float] = field(default_factory=list)
    output_tokens_stream: int = 0
    output_tokens_usage: int | None = None
    prompt_tokens_usage: int | None = None
    cached_tokens_usage: int | None = None
    """``usage.prompt_tokens_details.cached_tokens``: prompt tokens the server found in its cache."""
    error: str | None = None
    error_detail: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def output_tokens(self) -> int:
        return self.output_tokens_usage if self.output_tokens_usage is not None else self.output_tokens_stream


def request_body(endpoint: Endpoint, prompt: Prompt) -> bytes:
    body: dict[str, Any] = {
        "model": endpoint.model,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": prompt.max_tokens,
    }
    if endpoint.ignore_eos:
        body["ignore_eos"] = True
    if endpoint.api == "chat":
        body["messages"] = [{"role": "user", "content": prompt.text}]
    elif endpoint.send_token_ids and prompt.token_ids is not None:
        body["prompt"] = list(prompt.token_ids)
    else:
        body["prompt"] = prompt.text
    body.update(endpoint.extra_body)
    return _encode.encode(body)


def _chunk_text(event: dict[str, Any], api: Api) -> str:
    choices = event.get("choices") or ()
    if not choices:
        return ""
    choice = choices[0]
    if api == "chat":
        delta = choice.get("delta") or {}
        return (delta.get("content") or "") + (delta.get("reasoning_content") or "")
    return choice.get("text") or ""


async def send_request(
    session: aiohttp.ClientSession, endpoint: Endpoint, body: bytes, record: RequestRecord
) -> RequestRecord:
    """Send one request and fill ``record``; the caller owns cancellation (recorded as such)."""
    t0 = time.perf_counter()
    try:
        await _stream(session, endpoint, body, record, t0)
    except asyncio.CancelledError:
        record.error = record.error or "cancelled"
        raise
    except TimeoutError:
        record.error, record.error_detail = "timeout", f"no answer within {endpoint.request_timeout_s}s"
    except aiohttp.ClientConnectorError as exc:
        record.error, record.error_detail = "connect_error", str(exc)
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, ConnectionError) as exc:
        record.error, record.error_detail = "disconnected", str(exc)
    except aiohttp.ClientError as exc:
        record.error, record.error_detail = "client_error", f"{type(exc).__name__}: {exc}"
    except msgspec.DecodeError as exc:
        record.error, record.error_detail = "bad_response", str(exc)
    finally:
        record.e2e_s = time.perf_counter() - t0
    return record


async def _stream(
    session: aiohttp.ClientSession, endpoint: Endpoint, body: bytes, record: RequestRecord, t0: float
) -> None:
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    timeout = aiohttp.ClientTimeout(total=endpoint.request_timeout_s)
    async with session.post(endpoint.path, data=body, headers=headers, timeout=timeout) as resp:
        if resp.status != 200:
            record.error = f"http_{resp.status}"
            record.error_detail = (await resp.text())[:500]
            return
        done = False
        while line := await resp.content.readline():
            now = time.perf_counter()
            if not line.startswith(b"data:"):
                continue  # blank separators, comments, "event:" lines
            payload = line[5:].strip()
            if payload == b"[DONE]":
                done = True
                break
            if not _on_event(_decode.decode(payload), endpoint.api, record, now - t0):
                return
        if not done:
            record.error = "incomplete"
        elif record.output_tokens_stream == 0:
            record.error = "empty"


def _on_event(event: Any, api: Api, record: RequestRecord, t: float) -> bool:
    """Apply one SSE event to the record; False ends the stream (an error event)."""
    if not isinstance(event, dict):
        return True
    if event.get("error"):
        record.error, record.error_detail = "stream_error", str(event["error"])[:500]
        return False
    if _chunk_text(event, api):
        if record.ttft_s is None:
            record.ttft_s = t
        record.chunk_times_s.append(t)
        record.output_tokens_stream += 1
    usage = event.get("usage")
    if usage:
        record.output_tokens_usage = usage.get("completion_tokens")
        record.prompt_tokens_usage = usage.get("prompt_tokens")
        record.cached_tokens_usage = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    return True
