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

from interlock.frontend.schemas import MAX_STOP_STRINGS, ChatCompletionRequest, CompletionRequest
from interlock.protocol.sampling import MAX_SEED, MAX_TOP_LOGPROBS, MIN_SEED

_REF = "#/components/schemas/{name}"
_ERROR = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
            "required": ["message", "type", "param", "code"],
        }
    },
    "required": ["error"],
}
_ERRORS = {
    "400": "invalid request, or over a size limit",
    "401": "missing or unknown API key",
    "404": "unknown model",
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
    "n": {"enum": [1, None]},
    "presence_penalty": {"enum": [0, None]},
    "frequency_penalty": {"enum": [0, None]},
    "repetition_penalty": {"enum": [1, None]},
    "stop": {"maxItems": MAX_STOP_STRINGS},
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
            "tools": {"maxItems": 0},
            "tool_choice": {"enum": [None, "none"]},
            "response_format": {"enum": [None, {"type": "text"}]},
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
            # One prompt: text, token ids, or a batch of one of either.
            "prompt": {
                "anyOf": [
                    {"type": "string", "minLength": 1},
                    _TOKEN_IDS,
                    {
                        "type": "array",
                        "minItems": 1,
                        "maxItems": 1,
                        "items": {"type": "string", "minLength": 1},
                    },
                    {"type": "array", "minItems": 1, "maxItems": 1, "items": _TOKEN_IDS},
                ]
            },
            "logprobs": {"minimum": 0, "maximum": MAX_TOP_LOGPROBS},
            "echo": {"enum": [False, None]},
            "best_of": {"enum": [1, None]},
            "suffix": {"maxLength": 0},
        },
        "allOf": [_STREAM_OPTIONS_NEED_STREAM],
    },
    "ContentPart": {
        "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
        "required": ["type", "text"],
    },
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
    (chat, completion), components = msgspec.json.schema_components(
        [ChatCompletionRequest, CompletionRequest], ref_template=_REF
    )
    for name, extra in _ACCEPTED.items():
        _narrow(components[name], extra)
    components["Error"] = _ERROR
    return {
        "openapi": "3.1.0",
        "info": {"title": "Interlock OpenAI-compatible API", "version": version},
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
        "paths": {
            "/v1/chat/completions": {"post": _generate("Create a chat completion", chat, "chat.completion")},
            "/v1/completions": {"post": _generate("Create a text completion", completion, "text_completion")},
            "/v1/models": {"get": _get("List the models served now", "list of model cards")},
            "/v1/models/{model}": {
                "get": {
                    **_get("One model card", "model card", errors=("401", "404")),
                    "parameters": [
                        {"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}
                    ],
                }
            },
            "/health": {"get": _get("Ready to serve: 503 while no model is servable", "status", open_=True)},
            "/live": {"get": _get("The process is up", "status", open_=True)},
            "/metrics": {"get": _get("Prometheus metrics", "text exposition format", open_=True, text=True)},
            "/openapi.json": {"get": _get("This document", "OpenAPI document")},
        },
    }


def _generate(summary: str, body: dict[str, Any], object_name: str) -> dict[str, Any]:
    return {
        "summary": summary,
        "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
        "responses": {
            "200": {
                "description": f"a {object_name} object, or with stream=true a text/event-stream of chunks",
                "content": {"application/json": {"schema": {"type": "object"}}, "text/event-stream": {}},
            },
            **_error_responses(_ERRORS),
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


def _error_responses(errors: dict[str, str]) -> dict[str, Any]:
    return {
        status: {
            "description": text,
            "content": {"application/json": {"schema": {"$ref": _REF.format(name="Error")}}},
        }
        for status, text in errors.items()
    }
