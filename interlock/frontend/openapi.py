"""The OpenAPI 3.1 document of the HTTP API, served at ``/openapi.json``.

Request bodies are generated from the same msgspec structs that decode them, so the document
cannot drift from what the server accepts (unknown fields show as ``additionalProperties:
false``). The checks the parsers and ``SamplingParams.validate`` make after decoding (ranges,
fields accepted only at their neutral value, fields that need another) are added on top from
``_ACCEPTED``, so a body the document allows is one the server takes, up to what depends on the
served model (its context length and vocabulary). Response bodies are the OpenAI shapes,
described by name only.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import msgspec

from interlock.frontend.response_schemas import ERROR, SCHEMAS
from interlock.frontend.responses_api import ResponsesRequest
from interlock.frontend.schemas import (
    MAX_CHOICES,
    MAX_ID_CHARS,
    MAX_LOGIT_BIAS,
    MAX_METADATA_PAIRS,
    MAX_REPETITION_PENALTY,
    MAX_STOP_STRINGS,
    ChatCompletionRequest,
    CompletionRequest,
)
from interlock.frontend.tokenize import DetokenizeRequest, TokenizeRequest
from interlock.protocol.sampling import MAX_SEED, MAX_TOP_LOGPROBS, MIN_SEED

_REF = "#/components/schemas/{name}"
_ERROR = ERROR
_ERRORS = {
    "400": "invalid request, or over a size limit",
    "401": "missing or unknown API key",
    "404": "unknown model or path",
    "405": "method not allowed on this path",
    "408": "the body did not arrive in time",
    "413": "body too large",
    "429": "rate limit of the API key reached (see Retry-After)",
    "503": "no worker can take the request now (see Retry-After)",
}

# What the parsers (schemas.py) and SamplingParams.validate refuse after msgspec decoded the
# body, as JSON Schema keywords merged into the generated ones: per-field under "properties",
# whole-body ones beside it. Numeric and array keywords leave a field's null branch alone.
_SAMPLING: dict[str, Any] = {
    "max_tokens": {"minimum": 1},
    "min_tokens": {"minimum": 0},
    "temperature": {"minimum": 0, "maximum": 100},
    "top_p": {"exclusiveMinimum": 0, "maximum": 1},
    "top_k": {"minimum": -1},
    "min_p": {"minimum": 0, "maximum": 1},
    "seed": {"minimum": MIN_SEED, "maximum": MAX_SEED},
    "n": {"minimum": 1, "maximum": MAX_CHOICES},
    "presence_penalty": {"minimum": -2, "maximum": 2},
    "frequency_penalty": {"minimum": -2, "maximum": 2},
    "repetition_penalty": {"exclusiveMinimum": 0, "maximum": MAX_REPETITION_PENALTY},
    "stop": {"maxItems": MAX_STOP_STRINGS},
    "logit_bias": {
        "maxProperties": MAX_LOGIT_BIAS,
        "propertyNames": {"pattern": "^[0-9]{1,9}$"},
        "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100},
    },
    "metadata": {
        "maxProperties": MAX_METADATA_PAIRS,
        "propertyNames": {"maxLength": 64},
        "additionalProperties": {"type": "string", "maxLength": 512},
    },
    "store": {"enum": [False, None]},
    "service_tier": {"enum": ["auto", "default", None]},
    "spaces_between_special_tokens": {"const": True},
    **{name: {"maxLength": MAX_ID_CHARS} for name in ("user", "safety_identifier", "prompt_cache_key")},
}
_STREAM_OPTIONS_NEED_STREAM = {
    "if": {"properties": {"stream_options": {"type": "object"}}, "required": ["stream_options"]},
    "then": {"properties": {"stream": {"const": True}}, "required": ["stream"]},
}
_TOKEN_IDS = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}
_ACCEPTED: dict[str, dict[str, Any]] = {
    "ChatCompletionRequest": {
        "properties": {
            **_SAMPLING,
            "messages": {"minItems": 1},
            "max_completion_tokens": {"minimum": 1},
            "top_logprobs": {"minimum": 0, "maximum": MAX_TOP_LOGPROBS},
            "reasoning_effort": {"enum": ["none", None]},
            "verbosity": {"enum": ["medium", None]},
            "modalities": {"enum": [["text"], None]},
            "echo": {"const": False},
            **{
                name: {"enum": [None]}
                for name in (
                    "audio",
                    "prediction",
                    "web_search_options",
                    "functions",
                    "function_call",
                )
            },
        },
        "allOf": [
            _STREAM_OPTIONS_NEED_STREAM,
            {
                "if": {"properties": {"top_logprobs": {"type": "integer"}}, "required": ["top_logprobs"]},
                "then": {"properties": {"logprobs": {"const": True}}, "required": ["logprobs"]},
            },
        ],
    },
    "CompletionRequest": {
        "properties": {
            **_SAMPLING,
            # One prompt (text or token ids), or a batch of them.
            "prompt": {
                "anyOf": [
                    {"type": "string", "minLength": 1},
                    _TOKEN_IDS,
                    {
                        "type": "array",
                        "minItems": 1,
                        "maxItems": MAX_CHOICES,
                        "items": {"anyOf": [{"type": "string", "minLength": 1}, _TOKEN_IDS]},
                    },
                ]
            },
            "logprobs": {"minimum": 0, "maximum": MAX_TOP_LOGPROBS},
            "best_of": {"minimum": 1, "maximum": MAX_CHOICES},
            "suffix": {"maxLength": 0},
        },
        "allOf": [
            _STREAM_OPTIONS_NEED_STREAM,
            {  # echo with logprobs would need the prompt's logprobs
                "if": {"properties": {"echo": {"const": True}}, "required": ["echo"]},
                "then": {"properties": {"logprobs": {"type": "null"}}},
            },
        ],
    },
    "ContentPart": {
        "anyOf": [
            {
                "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
                "required": ["type", "text"],
            },
            {
                "properties": {"type": {"const": "refusal"}, "refusal": {"type": "string"}},
                "required": ["type", "refusal"],
            },
        ],
    },
    "ChatMessage": {"properties": {"role": {"enum": ["system", "developer", "user", "assistant", "tool"]}}},
    "JsonSchemaFormat": {"properties": {"description": {"type": "null"}}},
    "ResponseFormat": {"properties": {"type": {"enum": ["text", "json_object", "json_schema"]}}},
    "StructuredOutputs": {"minProperties": 1, "maxProperties": 1},
    "ResponsesRequest": {
        "properties": {
            "max_output_tokens": {"minimum": 1},
            "max_tool_calls": {"minimum": 1},
            "truncation": {"enum": ["disabled", None]},
            "include": {"maxItems": 0},
            "background": {"enum": [False, None]},
            "store": {"type": ["boolean", "null"]},
            "temperature": {"minimum": 0, "maximum": 100},
            "top_p": {"minimum": 0, "maximum": 1},
            "service_tier": {"enum": ["auto", "default", None]},
        },
    },
    "Reasoning": {"properties": {"effort": {"enum": ["none", None]}, "summary": {"type": "null"}}},
    "TextConfig": {"properties": {"verbosity": {"enum": ["medium", None]}}},
}


def _narrow(schema: dict[str, Any], extra: dict[str, Any]) -> None:
    for name, keywords in extra.get("properties", {}).items():
        field = schema["properties"][name]
        if "anyOf" in keywords:  # a new set of alternatives replaces the generated one
            field.pop("anyOf", None)
        field.update(keywords)
    schema.update({k: v for k, v in extra.items() if k != "properties"})


@cache
def openapi_document(version: str) -> dict[str, Any]:
    (chat, completion, responses, tokenize, detokenize), components = msgspec.json.schema_components(
        [ChatCompletionRequest, CompletionRequest, ResponsesRequest, TokenizeRequest, DetokenizeRequest],
        ref_template=_REF,
    )
    for name, extra in _ACCEPTED.items():
        _narrow(components[name], extra)
    components["Error"] = _ERROR
    components.update(SCHEMAS)
    return {
        "openapi": "3.1.0",
        "info": {"title": "Interlock OpenAI-compatible API", "version": version},
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
        "paths": {
            "/v1/chat/completions": {
                "post": _generate("Create a chat completion", chat, "chat.completion", "ChatCompletion")
            },
            "/v1/completions": {
                "post": _generate("Create a text completion", completion, "text_completion", "Completion")
            },
            "/v1/models": {"get": _get("List the models served now", "list of model cards")},
            "/v1/models/{model}": {
                "get": {
                    **_get("One model card", "model card", errors=("401", "404")),
                    "parameters": [
                        {"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}
                    ],
                }
            },
            "/v1/responses": {
                "post": _generate("Create a response (the Responses API)", responses, "response", "Response")
            },
            "/v1/responses/{response_id}": {
                op: {
                    **_get(
                        summary, "the stored response" if op == "get" else "deletion", errors=("401", "404")
                    ),
                    "parameters": [
                        {"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}
                    ],
                }
                for op, summary in (("get", "A stored response"), ("delete", "Delete a stored response"))
            },
            "/tokenize": {"post": _post("Tokenize a prompt or chat messages (vLLM's)", tokenize)},
            "/detokenize": {"post": _post("Token ids back to text (vLLM's)", detokenize)},
            "/version": {"get": _get("The server's version", "version")},
            "/health": {"get": _health()},
            "/live": {"get": _get("The process is up", "status", open_=True)},
            "/metrics": {"get": _get("Prometheus metrics", "text exposition format", open_=True, text=True)},
            "/openapi.json": {"get": _get("This document", "OpenAPI document")},
        },
    }


def _generate(summary: str, body: dict[str, Any], object_name: str, schema: str) -> dict[str, Any]:
    return {
        "summary": summary,
        "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
        "responses": {
            "200": {
                "description": f"a {object_name} object, or with stream=true a text/event-stream of chunks",
                "content": {
                    "application/json": {"schema": {"$ref": _REF.format(name=schema)}},
                    "text/event-stream": {},
                },
            },
            **_error_responses(_ERRORS),
        },
    }


def _post(summary: str, body: dict[str, Any]) -> dict[str, Any]:
    return {
        "summary": summary,
        "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
        "responses": {
            "200": {"description": "the result", "content": {"application/json": {}}},
            **_error_responses({k: _ERRORS[k] for k in ("400", "401", "404", "413")}),
        },
    }


def _get(
    summary: str,
    description: str,
    *,
    errors: tuple[str, ...] = ("401",),
    open_: bool = False,
    text: bool = False,
) -> dict[str, Any]:
    media = "text/plain" if text else "application/json"
    op: dict[str, Any] = {
        "summary": summary,
        "responses": {
            "200": {"description": description, "content": {media: {}}},
            **_error_responses({k: _ERRORS[k] for k in errors if not open_}),
        },
    }
    if open_:
        op["security"] = []  # open by default (configurable)
    return op


def _health() -> dict[str, Any]:
    op = _get("Ready to serve: 503 while no model is servable", "status", open_=True)
    op["responses"]["503"] = {
        "description": "not ready: no model servable yet (no worker, or its tokenizer still loading)",
        "content": {"application/json": {}},
    }
    return op


def _error_responses(errors: dict[str, str]) -> dict[str, Any]:
    return {
        status: {
            "description": text,
            "content": {"application/json": {"schema": {"$ref": _REF.format(name="Error")}}},
        }
        for status, text in errors.items()
    }
