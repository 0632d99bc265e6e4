"""The response bodies and stream chunks as OpenAI's specification requires them: JSON Schemas of
their required and nullable fields (what a strict client's types check), served in
``/openapi.json`` and used by the tests to validate every body and chunk the server writes.

Written down here rather than taken from OpenAI's 20k-line document: only the fields a client
relies on are pinned, and each is checked with the nullability the specification gives it (a
non-streamed chat message's ``refusal`` is required and null when there is none).
"""

from __future__ import annotations

from typing import Any

_INT = {"type": "integer"}
_STR = {"type": "string"}
_NULL_STR = {"type": ["string", "null"]}
_CHAT_FINISH = {"enum": ["stop", "length", "tool_calls", "content_filter", "function_call"]}
_USAGE = {
    "type": "object",
    "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
    "properties": {
        "prompt_tokens": _INT,
        "completion_tokens": _INT,
        "total_tokens": _INT,
        "prompt_tokens_details": {"type": "object", "properties": {"cached_tokens": _INT}},
    },
}
_TOP: dict[str, Any] = {
    "type": "object",
    "required": ["token", "logprob", "bytes"],
    "properties": {"token": _STR, "logprob": {"type": "number"}, "bytes": {"type": ["array", "null"]}},
}
_CHAT_LOGPROBS = {
    "type": ["object", "null"],
    "required": ["content", "refusal"],
    "properties": {
        "content": {
            "type": ["array", "null"],
            "items": {
                **_TOP,
                "required": [*_TOP["required"], "top_logprobs"],
                "properties": {**_TOP["properties"], "top_logprobs": {"type": "array", "items": _TOP}},
            },
        },
        "refusal": {"type": ["array", "null"]},
    },
}
_TOOL_CALL = {
    "type": "object",
    "required": ["id", "type", "function"],
    "properties": {
        "id": _STR,
        "type": {"const": "function"},
        "function": {
            "type": "object",
            "required": ["name", "arguments"],
            "properties": {"name": _STR, "arguments": _STR},
        },
    },
}
_HEAD = {"id": _STR, "created": _INT, "model": _STR}

CHAT_COMPLETION = {
    "type": "object",
    "required": ["id", "object", "created", "model", "choices"],
    "properties": {
        **_HEAD,
        "object": {"const": "chat.completion"},
        "usage": _USAGE,
        "choices": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["index", "message", "finish_reason", "logprobs"],
                "properties": {
                    "index": _INT,
                    "finish_reason": _CHAT_FINISH,
                    "logprobs": _CHAT_LOGPROBS,
                    "message": {
                        "type": "object",
                        "required": ["role", "content", "refusal"],
                        "properties": {
                            "role": {"const": "assistant"},
                            "content": _NULL_STR,
                            "refusal": _NULL_STR,
                            "tool_calls": {"type": "array", "items": _TOOL_CALL},
                        },
                    },
                },
            },
        },
    },
}
CHAT_COMPLETION_CHUNK = {
    "type": "object",
    "required": ["id", "object", "created", "model", "choices"],
    "properties": {
        **_HEAD,
        "object": {"const": "chat.completion.chunk"},
        "usage": {"anyOf": [_USAGE, {"type": "null"}]},
        "choices": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["index", "delta", "finish_reason"],
                "properties": {
                    "index": _INT,
                    "finish_reason": {"anyOf": [_CHAT_FINISH, {"type": "null"}]},
                    "logprobs": _CHAT_LOGPROBS,
                    "delta": {
                        "type": "object",
                        "properties": {
                            "role": {"const": "assistant"},
                            "content": _NULL_STR,
                            "refusal": _NULL_STR,
                            "tool_calls": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "required": ["index"],
                                    "properties": {
                                        "index": _INT,
                                        "id": _STR,
                                        "type": {"const": "function"},
                                        "function": {"type": "object"},
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}
COMPLETION = {
    "type": "object",
    "required": ["id", "object", "created", "model", "choices"],
    "properties": {
        **_HEAD,
        "object": {"const": "text_completion"},
        "usage": {"anyOf": [_USAGE, {"type": "null"}]},
        "choices": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["index", "text", "logprobs", "finish_reason"],
                "properties": {
                    "index": _INT,
                    "text": _STR,
                    "finish_reason": {
                        "anyOf": [{"enum": ["stop", "length", "content_filter"]}, {"type": "null"}]
                    },
                    "logprobs": {
                        "type": ["object", "null"],
                        "properties": {
                            "tokens": {"type": "array", "items": _STR},
                            "token_logprobs": {"type": "array"},
                            "top_logprobs": {"type": "array"},
                            "text_offset": {"type": "array", "items": _INT},
                        },
                    },
                },
            },
        },
    },
}
_OUTPUT_ITEM = {
    "oneOf": [
        {
            "type": "object",
            "required": ["id", "type", "status", "role", "content"],
            "properties": {
                "type": {"const": "message"},
                "role": {"const": "assistant"},
                "status": {"enum": ["in_progress", "completed", "incomplete"]},
                "content": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["type", "text", "annotations"],
                        "properties": {
                            "type": {"const": "output_text"},
                            "text": _STR,
                            "annotations": {"type": "array"},
                        },
                    },
                },
            },
        },
        {
            "type": "object",
            "required": ["type", "call_id", "name", "arguments"],
            "properties": {
                "type": {"const": "function_call"},
                "call_id": _STR,
                "name": _STR,
                "arguments": _STR,
            },
        },
    ]
}
RESPONSE = {
    "type": "object",
    "required": [
        "id", "object", "created_at", "status", "error", "incomplete_details", "instructions", "model",
        "output", "parallel_tool_calls", "tool_choice", "tools", "metadata", "temperature", "top_p",
    ],
    "properties": {
        "id": _STR,
        "object": {"const": "response"},
        "created_at": {"type": "number"},
        "status": {"enum": ["completed", "failed", "in_progress", "cancelled", "queued", "incomplete"]},
        "error": {"type": ["object", "null"]},
        "incomplete_details": {"type": ["object", "null"]},
        "instructions": _NULL_STR,
        "model": _STR,
        "output": {"type": "array", "items": _OUTPUT_ITEM},
        "parallel_tool_calls": {"type": "boolean"},
        "tools": {"type": "array"},
        "usage": {
            "anyOf": [
                {
                    "type": "object",
                    "required": ["input_tokens", "input_tokens_details", "output_tokens", "output_tokens_details", "total_tokens"],
                },
                {"type": "null"},
            ]
        },
    },
}  # fmt: skip
RESPONSE_EVENT = {
    "type": "object",
    "required": ["type", "sequence_number"],
    "properties": {"type": {"type": "string", "pattern": "^response\\."}, "sequence_number": _INT},
    "allOf": [
        {
            "if": {"properties": {"type": {"enum": ["response.created", "response.in_progress", "response.completed", "response.incomplete"]}}},
            "then": {"required": ["response"], "properties": {"response": RESPONSE}},
        },
        {
            "if": {"properties": {"type": {"const": "response.output_text.delta"}}},
            "then": {"required": ["item_id", "output_index", "content_index", "delta", "logprobs"]},
        },
        {
            "if": {"properties": {"type": {"enum": ["response.output_item.added", "response.output_item.done"]}}},
            "then": {"required": ["output_index", "item"]},
        },
    ],
}  # fmt: skip
ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {"message": _STR, "type": _STR, "param": _NULL_STR, "code": _NULL_STR},
        }
    },
}
SCHEMAS: dict[str, dict[str, Any]] = {
    "ChatCompletion": CHAT_COMPLETION,
    "ChatCompletionChunk": CHAT_COMPLETION_CHUNK,
    "Completion": COMPLETION,
    "Response": RESPONSE,
    "ResponseStreamEvent": RESPONSE_EVENT,
}
