"""The choices of one request: a generation per choice, each with its assembler and formatter,
the copies of ``n`` sent once their prompt's first choice has its first token; and the check of
an output constraint before any of it is sent."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from interlock.frontend.assembler import OutputAssembler
from interlock.frontend.backend import Backend, RequestContext
from interlock.frontend.generation import Choices, Generation
from interlock.frontend.metrics import FrontendMetrics
from interlock.frontend.prepare import ToolPlan
from interlock.frontend.responses import ChatFormatter, CompletionFormatter
from interlock.frontend.responses_api import ResponsesFormatter, ResponsesRequest
from interlock.frontend.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    stop_strings,
)
from interlock.frontend.tokenizer import ModelTokenizer
from interlock.frontend.tool_parsers import ToolStreamParser
from interlock.protocol import GenerateOutput, GenerateRequest
from interlock.protocol.sampling import MAX_SEED

if TYPE_CHECKING:
    from interlock.engine.grammar import GrammarCompiler


@dataclass(frozen=True)
class Turn:
    """A Responses request, and the stored conversation it continues."""

    req: ResponsesRequest
    history: list[dict[str, Any]]


def tool_parser(plan: ToolPlan | None) -> ToolStreamParser | None:
    """The parser of a reply offered tools (fed a forced call's prefix, which the prompt ends
    with and the output does not)."""
    if plan is None or not plan.spec.active:
        return None
    parser = ToolStreamParser(plan.fmt, plan.spec.tools)
    if plan.call is not None and plan.call.prefix:
        parser.feed(plan.call.prefix)
    return parser


def _copy(request: GenerateRequest, j: int) -> GenerateRequest:
    """Choice ``j`` of a prompt: its own id, and its own seed (a seeded request's copies would
    otherwise all draw the same tokens)."""
    sampling = request.sampling
    if sampling.seed is not None and j:
        seed = (sampling.seed + j) % (MAX_SEED + 1)
        sampling = msgspec.structs.replace(sampling, seed=seed)
    return msgspec.structs.replace(request, request_id=f"{request.request_id}-{j}", sampling=sampling)


async def _not_sent() -> AsyncIterator[GenerateOutput]:
    """The stream of a copy not sent yet (``Choices`` replaces it before reading)."""
    raise AssertionError("a copy was read before it was sent")
    yield  # pragma: no cover


def _formatter(
    req: ChatCompletionRequest | CompletionRequest,
    request_id: str,
    model: str,
    tok: ModelTokenizer,
    prompt_ids: Sequence[int],
    assembler: OutputAssembler,
    *,
    index: int = 0,
    plan: ToolPlan | None = None,
    prompt: str | list[int] | None = None,
) -> ChatFormatter | CompletionFormatter:
    """``prompt``: a completion's prompt as the client sent it (echoed as it is when text)."""
    continuous = req.stream_options is not None and req.stream_options.continuous_usage_stats
    options: dict[str, Any] = {
        "token_ids_as_text": req.return_tokens_as_token_ids,
        "continuous_usage": assembler if continuous else None,
        "index": index,
    }
    if isinstance(req, ChatCompletionRequest):
        return ChatFormatter(
            request_id,
            model,
            int(time.time()),
            tok,
            tool_calls=tool_parser(plan),
            parallel_tool_calls=req.parallel_tool_calls is not False,
            **options,
        )
    echo, first = "", None
    if req.echo and req.logprobs is not None and prompt_ids:
        first = prompt_ids[0]
    if req.echo:  # the prompt's text as the client sent it, or its ids decoded
        echo = prompt if isinstance(prompt, str) else tok.decode(prompt_ids, skip_special_tokens=False)
    return CompletionFormatter(
        request_id, model, int(time.time()), tok, echo=echo, echo_first_token=first, **options
    )


def build_choices(
    backend: Backend,
    metrics: FrontendMetrics,
    req: ChatCompletionRequest | CompletionRequest,
    ctx: RequestContext,
    model: str,
    tok: ModelTokenizer,
    built: list[tuple[GenerateRequest, Sequence[int]]],
    sent: list[str | list[int] | None],
    n: int,
    started: float,
    plan: ToolPlan | None,
    turn: Turn | None = None,
) -> Choices:
    """A generation per choice: ``n`` per prompt. The first of each prompt is sent now; its
    copies once it has its first token, pinned to its worker (a session of their own unless
    the client named one), with the seed, if any, moved on by the copy's number. ``built`` and
    ``sent``: each prompt's request and ids, and the prompt as the client sent it (None: chat)."""
    prompts = len(built)
    gens: list[Generation] = []
    copies: dict[int, Callable[[], AsyncIterator[GenerateOutput]]] = {}
    for j in range(n):
        for p, (generate_request, ids) in enumerate(built):
            index = p * n + j
            assembler = OutputAssembler(
                tok,
                ids,
                stop=stop_strings(req),
                skip_special_tokens=req.skip_special_tokens,
                include_stop=req.include_stop_str_in_output,
            )
            choice_ctx = ctx
            if n > 1:
                choice_ctx = dataclasses.replace(ctx, session_id=ctx.session_id or f"{ctx.request_id}/{p}")
                choice_ctx.response_headers = ctx.response_headers
                generate_request = _copy(generate_request, j)
            stream = backend.generate(generate_request, choice_ctx) if j == 0 else _not_sent()
            if j > 0:
                copies[len(gens)] = functools.partial(backend.generate, generate_request, choice_ctx)
            formatter: ChatFormatter | CompletionFormatter | ResponsesFormatter
            if turn is not None:
                parser = tool_parser(plan)
                formatter = ResponsesFormatter(ctx.request_id, model, turn.req, assembler, parser)
            else:
                formatter = _formatter(
                    req, ctx.request_id, model, tok, ids, assembler, index=index, plan=plan, prompt=sent[p]
                )
            gens.append(Generation(stream, choice_ctx, assembler, formatter, model, metrics, started))
    return Choices(gens, prompts, copies)


class ConstraintCheck:
    """Compiles a request's output constraint in the frontend, before any work (one grammar
    compiler per model, built on first use)."""

    def __init__(self) -> None:
        self._compilers: dict[Path, GrammarCompiler] = {}

    async def check(
        self,
        tok: ModelTokenizer,
        generate_request: GenerateRequest,
        req: ChatCompletionRequest | CompletionRequest,
        plan: ToolPlan | None,
        turn: Turn | None,
    ) -> None:
        """Compile the output constraint, if any, before any work: a bad one is a 400 naming the
        field it came from (compiled grammars are cached, so the engine's compile is a hit when
        it shares the process, and cheap when it does not)."""
        structured = generate_request.sampling.structured
        if structured is None:
            return
        if plan is not None and plan.call is not None:
            param = "tools"
        elif req.structured_outputs is not None:
            param = "structured_outputs"
        else:
            param = "text.format" if turn is not None else "response_format"
        compiler = self._compilers.get(tok.model_path)
        if compiler is None:  # reading the vocabulary into the grammar engine takes ~0.3 s
            # imported on the first constrained request: the grammar engine is ~8 MiB of a
            # frontend's memory that serves none
            from interlock.engine.grammar import GrammarCompiler

            compiler = await asyncio.to_thread(
                GrammarCompiler,
                tok.tokenizer.to_str(),
                eos_token_ids=tok.eos_token_ids,
                vocab_size=tok.vocab_size,
            )
            self._compilers[tok.model_path] = compiler
        await asyncio.to_thread(compiler.compile, structured, param=param)
