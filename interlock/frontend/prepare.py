"""From a parsed OpenAI request to a ``GenerateRequest``: prompt tokens and sampling parameters.

Sampling fields the request leaves out take the model's recommended values (its
``generation_config.json``, or a known model's: SmolLM2's card uses temperature 0.2 and top_p
0.9), as vLLM does; then OpenAI's defaults (temperature 1, top_p 1).

Pure functions, but for ``prompt_ids``, which may encode a long prompt in a worker thread. The
context-length rule: the prompt plus ``max_tokens`` must fit in the
model's context. When the client did not set ``max_tokens`` the server picks it: everything that
fits for chat, the OpenAI default (16) for completions, clamped to what fits.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import msgspec

from interlock.errors import InvalidRequest, PromptTooLong
from interlock.frontend.backend import ModelEntry
from interlock.frontend.budget import TokenBudget, encode_within
from interlock.frontend.limits import check_prompt_chars, check_prompt_tokens
from interlock.frontend.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    chat_messages,
    closed_objects,
    completion_prompt,
    logit_bias,
    prompt_chars,
    structured_output,
    tool_spec,
)
from interlock.frontend.tokenizer import ModelTokenizer
from interlock.frontend.tool_prompts import messages_for_template, render_tools, template_tools
from interlock.frontend.tools import (
    ConstrainedCall,
    ToolFormat,
    ToolSpec,
    required_schema,
    template_takes_tools,
    tool_format_for,
)
from interlock.protocol import GenerateRequest, SamplingParams, StructuredOutput

COMPLETIONS_DEFAULT_MAX_TOKENS = 16


async def generate_request(
    req: ChatCompletionRequest | CompletionRequest,
    entry: ModelEntry,
    tok: ModelTokenizer,
    *,
    request_id: str,
    priority: int,
    max_prompt_chars: int | None,
    max_prompt_tokens: int | None,
    prompt: str | list[int] | None = None,
    plan: ToolPlan | None = None,
) -> tuple[GenerateRequest, Sequence[int]]:
    """The one text pipeline from a parsed request to what the backend serves, with the prompt
    limits (the HTTP frontend and the Python API both call it): the request and its prompt ids.
    ``prompt``: which of a completion request's prompts (``completion_prompts``); its only one
    when None."""
    budget = TokenBudget(max_prompt_tokens, entry.context_length)
    ids = await prompt_ids(req, tok, max_chars=max_prompt_chars, budget=budget, prompt=prompt, plan=plan)
    check_prompt_tokens(len(ids), max_prompt_tokens, param=prompt_chars(req)[1])
    sampling = sampling_params(
        req,
        prompt_len=len(ids),
        entry=entry,
        eos_token_ids=tok.eos_token_ids,
        vocab_size=tok.vocab_size,
        forced_call=plan.call if plan is not None else None,
        defaults=tok.generation_defaults,
    )
    request = GenerateRequest(
        request_id=request_id, token_ids=tuple(ids), sampling=sampling, model=entry.name, priority=priority
    )
    return request, ids


async def prompt_ids(
    req: ChatCompletionRequest | CompletionRequest,
    tok: ModelTokenizer,
    *,
    max_chars: int | None = None,
    budget: TokenBudget | None = None,
    prompt: str | list[int] | None = None,
    plan: ToolPlan | None = None,
) -> Sequence[int]:
    """The prompt's token ids (long texts are encoded off the event loop). A rendered chat
    prompt longer than ``max_chars`` is refused before it is encoded, a text over ``budget``
    before it is encoded in full (``budget.py``)."""
    if isinstance(req, ChatCompletionRequest):
        text = chat_prompt_text(req, tok, plan)
        if max_chars is not None:
            check_prompt_chars(len(text), max_chars, param="messages")
        # The template already wrote the special tokens (BOS, turn markers): add none.
        return await encode_within(tok, text, add_special_tokens=False, budget=budget, param="messages")
    if prompt is None:
        prompt = completion_prompt(req)
    if isinstance(prompt, str):
        return await encode_within(tok, prompt, add_special_tokens=True, budget=budget, param="prompt")
    check_token_ids(prompt, tok)
    return prompt


@dataclass(frozen=True)
class ToolPlan:
    """How one chat request's tools are offered and its calls read (``tools.py``'s contract)."""

    fmt: ToolFormat
    spec: ToolSpec
    call: ConstrainedCall | None
    """A forced call: the prompt ends with its prefix and the engine enforces its schema."""
    in_template: bool
    """The model's template renders the tools itself."""


def tool_plan(
    req: ChatCompletionRequest | CompletionRequest, tok: ModelTokenizer, model: str
) -> ToolPlan | None:
    """None when the request has no tools to offer and no tool history to render."""
    if not isinstance(req, ChatCompletionRequest):
        return None
    spec = tool_spec(req)
    history = any(m.tool_calls or m.role == "tool" for m in req.messages)
    if not spec.active and not history:
        return None
    source = tok.chat_template.source if tok.chat_template is not None else None
    fmt = tool_format_for(model, source)
    call = required_schema(fmt, _strict(spec)) if spec.active and spec.constrained else None
    if call is not None and req.parallel_tool_calls is False and call.schema.get("type") == "array":
        call = call._replace(schema={**call.schema, "maxItems": 1})
    return ToolPlan(fmt, spec, call, template_takes_tools(source))


def _strict(spec: ToolSpec) -> ToolSpec:
    """A forced call's tools as it enforces them: a ``strict`` tool's objects closed, as OpenAI's
    strict mode reads them (an unforced call is text the model writes: nothing to enforce)."""
    tools = tuple(
        dataclasses.replace(t, parameters=closed_objects(dict(t.parameters)))
        if t.strict and t.parameters
        else t
        for t in spec.tools
    )
    return dataclasses.replace(spec, tools=tools)


def chat_prompt_text(req: ChatCompletionRequest, tok: ModelTokenizer, plan: ToolPlan | None = None) -> str:
    if tok.chat_template is None:
        raise InvalidRequest(f"model {req.model!r} has no chat template; use /v1/completions", param="model")
    messages = chat_messages(req)
    tools = None
    if plan is not None and plan.in_template:
        messages, tools = messages_for_template(messages), template_tools(plan.spec)
    elif plan is not None:
        messages = render_tools(plan.fmt, messages, plan.spec)
    text = tok.chat_template.render(
        messages,
        add_generation_prompt=req.add_generation_prompt,
        continue_final_message=req.continue_final_message,
        extra=req.chat_template_kwargs,
        tools=tools,
    )
    if plan is not None and plan.call is not None and plan.call.prefix:
        text += plan.call.prefix
    return text


def check_token_ids(ids: list[int], tok: ModelTokenizer) -> None:
    vocab = tok.vocab_size
    if any(t >= vocab for t in ids):
        raise InvalidRequest(f"prompt token ids must be below the vocabulary size {vocab}", param="prompt")


def sampling_params(
    req: ChatCompletionRequest | CompletionRequest,
    *,
    prompt_len: int,
    entry: ModelEntry,
    eos_token_ids: tuple[int, ...],
    vocab_size: int | None = None,
    forced_call: ConstrainedCall | None = None,
    defaults: Mapping[str, float] | None = None,
) -> SamplingParams:
    """Validated SamplingParams whose max_tokens fits the context (PromptTooLong otherwise).
    ``defaults``: the model's recommended sampling values, for the fields the request omits."""
    defaults = defaults or {}
    requested, param = _requested_max_tokens(req)
    # OpenAI reads top_p 0 as "only the most likely token": greedy.
    greedy = req.top_p == 0.0
    structured = structured_output(req)
    if forced_call is not None:  # parse_chat refused a response_format beside it
        structured = ("json_schema", json.dumps(forced_call.schema))
    params = SamplingParams(
        max_tokens=requested if requested is not None else 1,
        temperature=0.0 if greedy else _given(req.temperature, defaults, "temperature", 1.0),
        top_p=1.0 if greedy else _given(req.top_p, defaults, "top_p", 1.0),
        top_k=int(_given(req.top_k, defaults, "top_k", 0)),
        min_p=_given(req.min_p, defaults, "min_p", 0.0),
        seed=req.seed,
        stop_token_ids=_stop_ids(req, eos_token_ids),
        ignore_eos=req.ignore_eos,
        min_tokens=0 if requested is None else req.min_tokens,
        logprobs=_logprobs(req),
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        repetition_penalty=_given(req.repetition_penalty, defaults, "repetition_penalty", 1.0),
        logit_bias=_logit_bias(req, vocab_size),
        prompt_logprobs=_prompt_logprobs(req),
        structured=StructuredOutput(kind=structured[0], spec=structured[1]) if structured else None,
    )
    params.validate()
    max_tokens = fit_max_tokens(
        requested, prompt_len=prompt_len, entry=entry, param=param, default=_default(req)
    )
    params = msgspec.structs.replace(
        params, max_tokens=max_tokens, min_tokens=min(req.min_tokens, max_tokens)
    )
    params.validate()
    return params


def fit_max_tokens(
    requested: int | None, *, prompt_len: int, entry: ModelEntry, param: str, default: int | None
) -> int:
    limit = entry.context_length
    room = limit - prompt_len
    if requested is None:
        if room < 1:
            raise PromptTooLong(
                f"This model's maximum context length is {limit} tokens. However, your prompt is "
                f"{prompt_len} tokens, which leaves no room for a completion.",
                param="messages" if param == "max_completion_tokens" else "prompt",
            )
        return room if default is None else min(default, room)
    if prompt_len + requested > limit:
        raise PromptTooLong(
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{prompt_len + requested} tokens ({prompt_len} in the prompt, {requested} in the "
            f"completion). Please reduce the length of the prompt or of {param}.",
            param=param,
        )
    return requested


def _requested_max_tokens(req: ChatCompletionRequest | CompletionRequest) -> tuple[int | None, str]:
    if isinstance(req, ChatCompletionRequest) and req.max_completion_tokens is not None:
        return req.max_completion_tokens, "max_completion_tokens"
    return req.max_tokens, "max_tokens"


def _default(req: ChatCompletionRequest | CompletionRequest) -> int | None:
    return COMPLETIONS_DEFAULT_MAX_TOKENS if isinstance(req, CompletionRequest) else None


def _stop_ids(req: ChatCompletionRequest | CompletionRequest, eos: tuple[int, ...]) -> tuple[int, ...]:
    # EOS is spelled out to the engine as a stop token unless the client asked to ignore it.
    extra = tuple(req.stop_token_ids or ())
    return tuple(dict.fromkeys(extra + (() if req.ignore_eos else eos)))


def _logprobs(req: ChatCompletionRequest | CompletionRequest) -> int | None:
    if isinstance(req, ChatCompletionRequest):
        return (req.top_logprobs or 0) if req.logprobs else None
    return req.logprobs


def _prompt_logprobs(req: ChatCompletionRequest | CompletionRequest) -> int | None:
    """vLLM's ``prompt_logprobs``; a completion's echo with logprobs needs them too."""
    wanted = req.prompt_logprobs
    if isinstance(req, CompletionRequest) and req.echo and req.logprobs is not None:
        wanted = max(wanted or 0, req.logprobs)
    return wanted


def _given(value: float | None, defaults: Mapping[str, float], name: str, fallback: float) -> float:
    """The request's value, else the model's recommended one, else OpenAI's default."""
    return value if value is not None else defaults.get(name, fallback)


def _logit_bias(
    req: ChatCompletionRequest | CompletionRequest, vocab_size: int | None
) -> tuple[tuple[int, float], ...]:
    pairs = logit_bias(req)
    if vocab_size is not None and any(t >= vocab_size for t, _ in pairs):
        raise InvalidRequest(
            f"logit_bias token ids must be below the vocabulary size {vocab_size}", param="logit_bias"
        )
    return pairs
