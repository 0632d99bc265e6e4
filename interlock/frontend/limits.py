"""Size limits a request must meet before it costs the server anything else.

Tokenizing is the expensive step a hostile body can reach: a 30 MB prompt with no whitespace
is one "word" to a BPE tokenizer, which took the frontend to 4 GiB and ~40 s of CPU before
the context-length check could refuse it. So the prompt's size in characters is checked right
after the JSON is decoded (and the rendered chat template again before it is encoded), and its
size in tokens right after encoding. Nesting depth is checked on the few fields whose JSON
shape is free (``Any``); every other field has a fixed type, so msgspec refuses deep nesting
there at the first level that does not match.

The headers the server keeps beyond the request (the session id in the router's affinity table,
up to 100,000 entries; the request id in logs and the reply) are held to ``max_header_chars``
before the body is read: aiohttp alone allows 8 KiB a header, which made the session table
~780 MB at its cap.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from interlock.errors import LimitExceeded
from interlock.frontend.backend import HEADER_PRIORITY, HEADER_REQUEST_ID, HEADER_SESSION_ID, HEADER_WORKER_ID

DEFAULT_MAX_PROMPT_CHARS = 1_000_000
DEFAULT_MAX_JSON_DEPTH = 32
# Integers travel to the router and engines as plain ints, over NATS as msgpack, which cannot
# carry 2**64 (JSON and msgspec's decoder can). Fields with no other bound are held to 32 bits
# at the edge: more than any scheduling policy, vocabulary or top-k needs.
MIN_PRIORITY, MAX_PRIORITY = -(2**31), 2**31 - 1
MAX_INT32 = 2**31 - 1


KEPT_HEADERS = (HEADER_REQUEST_ID, HEADER_SESSION_ID, HEADER_WORKER_ID, HEADER_PRIORITY)
"""Headers whose values outlive parsing (with the configured route-key header)."""


def check_header_values(headers: Iterable[tuple[str, str]], kept: frozenset[str], max_chars: int) -> None:
    """Refuse a request with a value of one of ``kept`` (lower-case names) longer than
    ``max_chars`` (every occurrence counts: a repeated header is not a way around the limit)."""
    for name, value in headers:
        if len(value) > max_chars and name.lower() in kept:
            raise LimitExceeded(
                f"the {name.lower()} header is {len(value)} characters; this server accepts at most "
                f"{max_chars} (max_header_chars)",
                param=name.lower(),
            )


def check_prompt_chars(size: int, max_chars: int, *, param: str) -> None:
    """Refuse a prompt of more than ``max_chars`` characters (token ids count one each)."""
    if size > max_chars:
        raise LimitExceeded(
            f"the prompt is {size} characters; this server accepts at most {max_chars} (max_prompt_chars)",
            param=param,
        )


def check_prompt_tokens(n_tokens: int, max_tokens: int | None, *, param: str) -> None:
    if max_tokens is not None and n_tokens > max_tokens:
        raise LimitExceeded(
            f"the prompt is {n_tokens} tokens; this server accepts at most {max_tokens} (max_prompt_tokens)",
            param=param,
        )


def check_depth(value: Any, max_depth: int, *, param: str) -> None:
    """Refuse a decoded JSON value nested deeper than ``max_depth`` arrays/objects."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, dict, msgspec.Struct)):
            depth += 1
            if depth > max_depth:
                raise depth_error(max_depth, param=param)
            children = (
                item.values()
                if isinstance(item, dict)
                else (msgspec.structs.astuple(item) if isinstance(item, msgspec.Struct) else item)
            )
            stack.extend(
                (child, depth) for child in children if isinstance(child, (list, dict, msgspec.Struct))
            )


def depth_error(max_depth: int, *, param: str | None) -> LimitExceeded:
    return LimitExceeded(
        f"the JSON body is nested more than {max_depth} levels deep (max_json_depth)", param=param
    )
