"""A prompt's token ids on the request plane: packed, 4 bytes an id (little-endian uint32).

As a msgpack array, a 60,000-token prompt cost its reader 0.9 ms to make 60,000 Python ints
again, and the engine then packed them once more to hash its blocks (0.3 ms). Packed, the
router's writer copies 240 KB, the worker's reader copies it back into an ``array('I')`` (a few
µs), and the engine keeps the prompt in that array: its block hashes, its vocabulary check and
the runners read it without one int object per token.

``GenerateRequest.token_ids`` takes any sequence of ints from Python callers; what the router
sends is ``pack(ids)``, and what a worker decodes is always an ``array('I')``. A peer that still
sends a msgpack array is read too (``dec_hook``); ids no uint32 holds make the request malformed
(the worker answers ``invalid_request``), and ids past the vocabulary are the engine's to refuse.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Mapping, Sequence
from typing import Any

from interlock import kvhash

TYPECODE = "I"
assert array(TYPECODE).itemsize == 4, "this platform's unsigned int is not 4 bytes"

ANNOUNCED = ("prompt_ids", "packed")
"""What a worker that reads packed ids puts in ``InstanceInfo.metadata``; a router sends an older
worker, which lacks it, a msgpack array as before (``for_peer``)."""

MEMO_TOKENS = 2048
"""Prompts at least this long are remembered by identity (``pack``): a prompt sent again comes
back from the frontend's tokenizer cache as the very same tuple, and packs to the same array,
whose block hashes the router remembers from this length on too (``HASH_MEMO_TOKENS``)."""

_memo: list[tuple[tuple[int, ...], array[int]]] = []
_MEMO_SIZE = 8


def pack(ids: Sequence[int]) -> array[int]:
    """The ids as an ``array('I')`` (the same object when ``ids`` is one already). Raises
    ``OverflowError`` or ``TypeError`` for ids no uint32 holds."""
    if isinstance(ids, array) and ids.typecode == TYPECODE:
        return ids
    if isinstance(ids, tuple) and len(ids) >= MEMO_TOKENS:
        for key, packed in _memo:
            if key is ids:  # the same tuple: equal, and nobody can change it
                return packed
        packed = array(TYPECODE, ids)
        _memo.insert(0, (ids, packed))
        del _memo[_MEMO_SIZE:]
        return packed
    return array(TYPECODE, ids)


def for_peer(ids: Sequence[int], metadata: Mapping[str, str]) -> Sequence[int]:
    """``ids`` as a worker announcing ``metadata`` reads them: packed where it says so, a list
    otherwise (an older worker, during a rolling upgrade)."""
    key, value = ANNOUNCED
    if metadata.get(key) == value or not isinstance(ids, array):
        return ids
    return ids.tolist()


def enc_hook(obj: Any) -> Any:
    """msgspec's encode hook: an ids array as its packed little-endian bytes."""
    if isinstance(obj, array) and obj.typecode == TYPECODE:
        if sys.byteorder == "big":
            return kvhash.u32_bytes(obj)
        return obj.tobytes()
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


def dec_hook(kind: type, obj: Any) -> Any:
    """msgspec's decode hook for ``array``-typed fields: packed bytes (or an older peer's list)
    as an ``array('I')``."""
    if kind is not array:
        raise NotImplementedError(f"cannot decode {kind!r}")
    if isinstance(obj, bytes | bytearray | memoryview):
        if len(obj) % 4:
            raise ValueError(f"packed token ids are 4 bytes each, got {len(obj)} bytes")
        out = array(TYPECODE)
        out.frombytes(obj)
        if sys.byteorder == "big":
            out.byteswap()
        return out
    if isinstance(obj, list):
        try:
            return array(TYPECODE, obj)
        except (OverflowError, TypeError):  # the worker answers invalid_request, naming it
            raise ValueError("token ids must be integers in [0, 2**32)") from None
    raise ValueError(f"token ids must be packed bytes or an array of ints, got {type(obj).__name__}")
