"""Every request field of the OpenAI endpoints, and what this server does with it.

The source of ``docs/openai.md`` (``python -m interlock.frontend.fields`` writes it). Tests hold
it to the code: every field of every request struct is here and nothing else, the document is
this table as rendered, and each field's support matches the server's behaviour (a field marked
``no`` is refused by name when set to anything but its neutral value; ``yes`` changes the output;
``partly`` does one or the other by value; ``log`` never changes the output, by design).
"""

from __future__ import annotations

from typing import Literal, NamedTuple

Support = Literal["yes", "partly", "no", "log"]


class Field(NamedTuple):
    support: Support
    how: str


# Fields both generation endpoints share (schemas._Sampling).
_SAMPLING: dict[str, Field] = {
    "model": Field("yes", "the served model (404 naming it otherwise)"),
    "max_tokens": Field(
        "yes", "output cap; the prompt plus it must fit the context (completions default 16)"
    ),
    "stop": Field("yes", "up to 16 strings, matched across tokens; not in the output"),
    "stop_token_ids": Field("yes", "vLLM's: token ids that end the output"),
    "temperature": Field("yes", "0 is greedy; [0, 100]"),
    "top_p": Field("yes", "nucleus sampling; 0 means greedy, as at OpenAI"),
    "top_k": Field("yes", "vLLM's; 0 or -1 off"),
    "min_p": Field("yes", "vLLM's"),
    "seed": Field(
        "yes", "draws depend on (seed, token index) only: same seed, same output on any worker and batch"
    ),
    "n": Field(
        "yes",
        "up to 64 choices (times the prompts); copies reuse the first choice's prompt cache; seeds move on by the copy's number",
    ),
    "stream": Field("yes", "server-sent events, ending with [DONE]"),
    "stream_options": Field("yes", "see StreamOptions"),
    "ignore_eos": Field("yes", "vLLM's: generate past the end-of-sequence token"),
    "min_tokens": Field("yes", "vLLM's: stop tokens are masked before this many"),
    "skip_special_tokens": Field("yes", "vLLM's: false keeps special tokens in the text"),
    "spaces_between_special_tokens": Field("partly", "vLLM's: true (the neutral value) only"),
    "include_stop_str_in_output": Field("yes", "vLLM's: the matched stop string stays in the output"),
    "return_tokens_as_token_ids": Field("yes", "vLLM's: logprobs name tokens as token_id:N"),
    "presence_penalty": Field("yes", "[-2, 2], on the output's tokens, in the engine's sampler"),
    "frequency_penalty": Field("yes", "[-2, 2], per occurrence in the output"),
    "repetition_penalty": Field("yes", "vLLM's: (0, 10], over prompt and output tokens"),
    "logit_bias": Field("yes", "token id to a bias in [-100, 100], ids checked against the vocabulary"),
    "prompt_logprobs": Field(
        "yes",
        "vLLM's: each prompt token's logprob and the top N (the prompt is computed whole, no prefix-cache hit)",
    ),
    "structured_outputs": Field(
        "yes", "vLLM's: one of json, regex, choice, grammar, json_object, enforced while decoding"
    ),
    "priority": Field("yes", "vLLM's: lower is more important, in the router's and the engine's queues"),
    "user": Field(
        "log", "the access log's user; an end user's requests in flight are capped (max_client_requests)"
    ),
    "safety_identifier": Field("log", "as user, and preferred to it"),
    "prompt_cache_key": Field(
        "yes",
        "a route key (unless x-route-key is sent): requests sharing it go to the workers holding their KV",
    ),
    "metadata": Field("log", "up to 16 pairs, in the access log"),
    "store": Field("partly", "false only: chat completions are not kept (the Responses API keeps responses)"),
    "service_tier": Field("partly", '"auto" or "default" only'),
}

_CHAT: dict[str, Field] = {
    "messages": Field("yes", "rendered with the model's chat template"),
    "max_completion_tokens": Field("yes", "as max_tokens, which it overrides"),
    "logprobs": Field("yes", "the sampled token's logprob, of the raw distribution"),
    "top_logprobs": Field("yes", "up to 20 alternatives; needs logprobs"),
    "add_generation_prompt": Field("yes", "vLLM's: false leaves the assistant turn unopened"),
    "continue_final_message": Field("yes", "vLLM's: the last (assistant) message is continued"),
    "chat_template_kwargs": Field(
        "partly", "vLLM's: variables the model's template reads; others refused by name"
    ),
    "echo": Field("no", "not on chat"),
    "tools": Field(
        "yes", "function tools, offered in the model's own format (its template, or its family's prompt)"
    ),
    "tool_choice": Field(
        "yes",
        "none, auto, required or a named function; required and named enforced by a JSON-schema grammar",
    ),
    "parallel_tool_calls": Field("yes", "false keeps at most one call; only with tools"),
    "response_format": Field("yes", "text, json_object or json_schema, enforced while decoding"),
    "reasoning_effort": Field("partly", '"none" only: the model does not reason'),
    "verbosity": Field("partly", '"medium" (OpenAI\'s default) only: the model has one verbosity'),
    "modalities": Field("partly", '["text"] only'),
    "audio": Field("no", "text only"),
    "prediction": Field("no", "predicted outputs are not used"),
    "web_search_options": Field("no", "no web search"),
    "functions": Field("no", "deprecated: use tools"),
    "function_call": Field("no", "deprecated: use tool_choice"),
}

_COMPLETION: dict[str, Field] = {
    "prompt": Field("yes", "a string, token ids, or a batch of either (n choices each)"),
    "logprobs": Field("yes", "the sampled token's logprob and up to 20 alternatives"),
    "echo": Field(
        "yes", "the prompt's text before the completion's; with logprobs, the prompt's lead the arrays"
    ),
    "best_of": Field(
        "yes",
        "best_of choices generated, the n with the highest mean logprob per token returned; not streamed",
    ),
    "suffix": Field("no", "the model has no fill-in-the-middle mode"),
}

_NESTED: dict[str, Field] = {
    "StreamOptions.include_usage": Field("yes", "a last chunk with the usage"),
    "StreamOptions.continuous_usage_stats": Field("yes", "vLLM's: the usage so far in every chunk"),
    "ChatMessage.role": Field("yes", "system, developer (as system), user, assistant, tool"),
    "ChatMessage.content": Field("yes", "a string or text parts"),
    "ChatMessage.name": Field(
        "yes", "to the template; a template without names gets 'name: ' before the text"
    ),
    "ChatMessage.tool_calls": Field("yes", "an assistant's earlier calls, in the model's call format"),
    "ChatMessage.tool_call_id": Field("yes", "a tool result's call; rendered as the family's tool response"),
    "ChatMessage.refusal": Field("yes", "an assistant's earlier refusal, as its text"),
    "ContentPart.type": Field("partly", "text and refusal only"),
    "ContentPart.text": Field("yes", "joined into the message's text"),
    "ContentPart.refusal": Field("yes", "an earlier refusal, as text"),
    "MessageToolCall.id": Field("yes", "matched by the tool result's tool_call_id"),
    "MessageToolCall.type": Field("yes", "function"),
    "MessageToolCall.function": Field("yes", "the call as the model made it"),
    "ToolCallFunction.name": Field("yes", "the called function"),
    "ToolCallFunction.arguments": Field("yes", "JSON text of its arguments"),
    "ResponseFormat.type": Field("yes", "text, json_object or json_schema"),
    "ResponseFormat.json_schema": Field("yes", "see JsonSchemaFormat"),
    "JsonSchemaFormat.name": Field("log", "a label"),
    "JsonSchemaFormat.schema": Field(
        "yes", "compiled once and cached; a bad schema is a 400 before any work"
    ),
    "JsonSchemaFormat.strict": Field(
        "yes",
        "the schema is always enforced; true also closes objects that do not say (additionalProperties false), as OpenAI's strict mode does",
    ),
    "JsonSchemaFormat.description": Field("no", "the schema alone shapes the output"),
    "StructuredOutputs.json": Field("yes", "a JSON schema"),
    "StructuredOutputs.regex": Field("yes", "a regular expression"),
    "StructuredOutputs.choice": Field("yes", "one of these strings"),
    "StructuredOutputs.grammar": Field("yes", "an EBNF (GBNF or Lark) grammar"),
    "StructuredOutputs.json_object": Field("yes", "any JSON object"),
}

_RESPONSES: dict[str, Field] = {
    "model": Field("yes", "the served model"),
    "input": Field("yes", "a string, or message, function_call and function_call_output items"),
    "instructions": Field("yes", "a system message first (not carried to a next turn)"),
    "max_output_tokens": Field("yes", "the output cap"),
    "temperature": Field("yes", "as on chat"),
    "top_p": Field("yes", "as on chat"),
    "tools": Field("partly", "function tools only"),
    "tool_choice": Field("yes", "as on chat"),
    "parallel_tool_calls": Field("yes", "false keeps one call"),
    "max_tool_calls": Field("yes", "the calls kept"),
    "text": Field("yes", "see TextConfig"),
    "stream": Field("yes", "the Responses events, response.created to response.completed"),
    "store": Field("yes", "kept in this frontend's memory (bounded) unless false"),
    "previous_response_id": Field("yes", "continues a stored response's conversation"),
    "metadata": Field("log", "the access log, and echoed in the response"),
    "user": Field("log", "as on chat"),
    "safety_identifier": Field("log", "as on chat"),
    "prompt_cache_key": Field("yes", "a route key, as on chat"),
    "service_tier": Field("partly", '"auto" or "default" only'),
    "reasoning": Field("partly", 'effort "none" only'),
    "truncation": Field("partly", '"disabled" only'),
    "include": Field("partly", "empty only"),
    "background": Field("partly", "false only"),
}

_RESPONSES_NESTED: dict[str, Field] = {
    "TextConfig.format": Field("yes", "text, json_object or json_schema, enforced while decoding"),
    "TextConfig.verbosity": Field("partly", '"medium" only'),
    "TextFormat.type": Field("yes", "text, json_object or json_schema"),
    "TextFormat.name": Field("log", "a label"),
    "TextFormat.schema": Field("yes", "the JSON schema"),
    "TextFormat.strict": Field("yes", "as on chat: true closes objects that do not say"),
    "TextFormat.description": Field("no", "the schema alone shapes the output"),
    "Reasoning.effort": Field("partly", '"none" only'),
    "Reasoning.summary": Field("no", "no reasoning to summarise"),
}

FIELDS: dict[str, Field] = {
    **{f"ChatCompletionRequest.{k}": v for k, v in {**_SAMPLING, **_CHAT}.items()},
    **{f"CompletionRequest.{k}": v for k, v in {**_SAMPLING, **_COMPLETION}.items()},
    **{f"ResponsesRequest.{k}": v for k, v in _RESPONSES.items()},
    **_NESTED,
    **_RESPONSES_NESTED,
}
_SECTIONS = (
    ("`POST /v1/chat/completions`", "ChatCompletionRequest."),
    ("`POST /v1/completions`", "CompletionRequest."),
    (
        "Nested objects of both",
        "StreamOptions. ChatMessage. ContentPart. MessageToolCall. ToolCallFunction. ResponseFormat. JsonSchemaFormat. StructuredOutputs.",
    ),
    ("`POST /v1/responses`", "ResponsesRequest. TextConfig. TextFormat. Reasoning."),
)


def render_markdown() -> str:
    lines = [
        "# OpenAI API compatibility",
        "",
        "Generated from `interlock/frontend/fields.py` (`python -m interlock.frontend.fields > docs/openai.md`);",
        "tests check it against the server's behaviour field by field. **yes**: honoured; **partly**:",
        "honoured at the values named, refused by name at the others; **no**: refused by name unless",
        "absent; **log**: never changes the output (it goes to the access log). Any field not listed is",
        "refused by name. Also served: `/tokenize`, `/detokenize`, `/version` (vLLM's),",
        "`GET`/`DELETE /v1/responses/{id}`, `/v1/models`, `/health`, `/metrics`, `/openapi.json`.",
    ]
    for title, prefixes in _SECTIONS:
        lines += ["", f"## {title}", "", "| field | support | how |", "|---|---|---|"]
        for key, field in FIELDS.items():
            if key.startswith(tuple(prefixes.split())):
                top = prefixes.split()[0]
                name = key[len(top) :] if key.startswith(top) and not title.startswith("Nested") else key
                lines.append(f"| `{name}` | {field.support} | {field.how} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render_markdown(), end="")
