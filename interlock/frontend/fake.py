"""An in-package fake Backend: deterministic tokens, configurable delays and failures, and a
record of every request, finish and abort. Used by the frontend's tests and by the
framework-overhead benchmark (its model time is just ``token_delay_s``).

What a request gets is decided by a ``FakeScript``: either one script for all requests, or a
function of the request and its context (so a test can make one model fail while another works).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

from interlock.frontend.backend import ModelEntry, RequestContext
from interlock.protocol import GenerateOutput, GenerateRequest, TokenLogprobs


@dataclass(frozen=True)
class FakeScript:
    token_ids: tuple[int, ...] | None = None
    """Tokens to emit (then finish "stop" if shorter than max_tokens); None: pseudo-random ids
    from ``token_range``, seeded by the prompt and the request's seed."""
    token_range: tuple[int, int] = (200, 10000)
    token_delay_s: float = 0.0
    first_token_delay_s: float = 0.0
    tokens_per_output: int = 1
    cached_tokens: int = 0
    error: Exception | None = None
    """Raised after ``error_after`` tokens were emitted (0: before the first output); normally an
    ``interlock.errors`` class, any other exception stands for a bug in the backend."""
    error_after: int = 0
    response_headers: tuple[tuple[str, str], ...] = ()


ScriptFor = Callable[[GenerateRequest, RequestContext], FakeScript]


@dataclass
class FakeBackend:
    entries: list[ModelEntry]
    script: FakeScript | ScriptFor = field(default_factory=FakeScript)
    requests: list[GenerateRequest] = field(default_factory=list)
    contexts: list[RequestContext] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    prefetched: list[str] = field(default_factory=list)
    """Models whose ``prefetch`` was called, in order."""
    active: int = 0
    keep_history: bool = True
    """False for benchmarks: do not grow the request lists."""

    def models(self) -> list[ModelEntry]:
        return self.entries

    def prefetch(self, model: str) -> None:
        self.prefetched.append(model)

    def script_for(self, request: GenerateRequest, ctx: RequestContext) -> FakeScript:
        return self.script if isinstance(self.script, FakeScript) else self.script(request, ctx)

    async def generate(
        self, request: GenerateRequest, ctx: RequestContext
    ) -> AsyncGenerator[GenerateOutput, None]:
        script = self.script_for(request, ctx)
        if self.keep_history:
            self.requests.append(request)
            self.contexts.append(ctx)
        ctx.response_headers.update(script.response_headers)
        if script.error is not None and script.error_after == 0:
            raise script.error
        self.active += 1
        done = False
        try:
            async for out in self._outputs(request, script):
                done = out.finished
                yield out
        finally:
            self.active -= 1
            if self.keep_history:
                (self.finished if done else self.aborted).append(request.request_id)

    async def _outputs(self, request: GenerateRequest, script: FakeScript) -> AsyncIterator[GenerateOutput]:
        tokens = _planned_tokens(request, script)
        stop_ids = set(request.sampling.stop_token_ids)
        emitted = 0
        if script.first_token_delay_s:
            await asyncio.sleep(script.first_token_delay_s)
        while True:
            if script.error is not None and emitted >= script.error_after:
                raise script.error
            chunk = list(tokens[emitted : emitted + script.tokens_per_output])
            hit_stop = False
            for i, t in enumerate(chunk):
                if t in stop_ids:  # like an engine: the stop token is the last one emitted
                    chunk, hit_stop = chunk[: i + 1], True
                    break
            emitted += len(chunk)
            reason = _finish_reason(emitted, len(tokens), request.sampling.max_tokens, hit_stop)
            yield GenerateOutput(
                request_id=request.request_id,
                token_ids=tuple(chunk),
                logprobs=_fake_logprobs(chunk, request.sampling.logprobs),
                finish_reason=reason,
                num_prompt_tokens=len(request.token_ids),
                num_cached_tokens=min(script.cached_tokens, len(request.token_ids)),
                prompt_logprobs=_fake_logprobs(request.token_ids[1:], request.sampling.prompt_logprobs)
                if emitted == len(chunk)
                else None,
            )
            if reason is not None:
                return
            if script.token_delay_s:
                await asyncio.sleep(script.token_delay_s)
            else:
                await asyncio.sleep(0)  # yield to the loop like a real stream would


def _planned_tokens(request: GenerateRequest, script: FakeScript) -> Sequence[int]:
    max_tokens = request.sampling.max_tokens
    if script.token_ids is not None:
        return script.token_ids[:max_tokens]
    seed = -1 if request.sampling.seed is None else request.sampling.seed
    rng = random.Random(hash((tuple(request.token_ids), seed)))
    low, high = script.token_range
    return [rng.randrange(low, high) for _ in range(max_tokens)]


def _finish_reason(emitted: int, planned: int, max_tokens: int, hit_stop: bool) -> str | None:
    if hit_stop:
        return "stop"
    if emitted >= max_tokens:
        return "length"
    if emitted >= planned:
        return "stop"
    return None


def _fake_logprobs(chunk: Sequence[int], n: int | None) -> tuple[TokenLogprobs, ...] | None:
    if n is None:
        return None
    # The sampled token is the best alternative; the others are its neighbours, each less likely.
    return tuple(TokenLogprobs(t, -0.25, tuple((t + i, -0.25 - i) for i in range(n))) for t in chunk)
