"""A model's tokenizer, read from its folder: fast (Rust) tokenizer, special tokens, stop ids.

Only the ``tokenizers`` library is used (no transformers import on the request path): it reads
``tokenizer.json`` directly, and ``tokenizer_config.json`` / ``generation_config.json`` are plain
JSON. Loaded once per folder and cached; nothing is downloaded.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders

from interlock import heap
from interlock.errors import ConfigError
from interlock.frontend.chunked import ChunkedEncoder, pipeline_spec, seams_exact, special_prefix
from interlock.frontend.templates import ChatTemplate, load_chat_template_source
from interlock.model_store import generation_defaults

_CACHE_LOCK = threading.Lock()
LONG_TEXT_CHARS = 8192


class ModelTokenizer:
    def __init__(self, model_path: Path) -> None:
        tokenizer_file = model_path / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise ConfigError(f"{model_path} has no tokenizer.json")
        self.model_path = model_path
        self.tokenizer = Tokenizer.from_file(str(tokenizer_file))
        config = _read_json(model_path / "tokenizer_config.json")
        self.bos_token = _token_text(config.get("bos_token"))
        self.eos_token = _token_text(config.get("eos_token"))
        self.eos_token_ids = self._eos_ids(model_path)
        self.generation_defaults = generation_defaults(model_path)
        """Sampling values for requests that leave them out (``model_store.generation_defaults``)."""
        self._byte_decoder = _byte_level_decoder() if _is_byte_level(self.tokenizer) else None
        self._byte_tables: dict[bool, tuple[bytes, ...]] = {}
        exact = seams_exact(self.tokenizer, pipeline_spec(self.tokenizer))
        self.chunked = ChunkedEncoder(self.tokenizer) if exact else None
        """Exact chunked encoding with a cache of chunks (``chunked.py``); None where a cut could
        change the ids."""
        self.special_prefix = special_prefix(self.tokenizer)
        """What ``add_special_tokens`` puts before a text, None if it adds more than a prefix."""
        source = load_chat_template_source(model_path, config)
        specials = {"bos_token": self.bos_token, "eos_token": self.eos_token}
        self.chat_template = ChatTemplate(source, special_tokens=specials) if source else None
        self.byte_table(skip_special_tokens=True)  # the detokenizer's, made here (~50 ms, 2 MiB)
        heap.trim()  # parsing tokenizer.json leaves ~16 MiB freed in malloc's arenas (SmolLM2)

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        # The batch call without offsets: 30 against 39 µs for a 41-token chat prompt.
        return self.tokenizer.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0].ids

    async def encode_async(self, text: str, *, add_special_tokens: bool) -> list[int]:
        """``encode`` that does not stall the event loop on long texts.

        ``Tokenizer.encode`` holds the GIL (200k tokens: ~1 s with every stream frozen), while
        ``encode_batch_fast`` releases it (and skips the offsets, ~40% of the work); long texts
        go through the latter in a worker thread.
        """
        if len(text) < LONG_TEXT_CHARS:
            return self.encode(text, add_special_tokens=add_special_tokens)
        return await asyncio.to_thread(self.encode, text, add_special_tokens=add_special_tokens)

    def count(self, text: str) -> int:
        """How many tokens ``text`` encodes to, special tokens left out (releases the GIL)."""
        return len(self.encode(text, add_special_tokens=False))

    @property
    def num_special_tokens(self) -> int:
        """Special tokens ``encode(..., add_special_tokens=True)`` adds to a text (BOS, say)."""
        return int(self.tokenizer.num_special_tokens_to_add(False))

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def token_bytes(self, token_id: int) -> bytes:
        """The exact bytes one token stands for (for logprobs' ``bytes``)."""
        return _token_bytes(self, token_id)

    def byte_table(self, skip_special_tokens: bool) -> tuple[bytes, ...] | None:
        """Every token id's bytes (special tokens b"" when skipped), for a byte-level tokenizer,
        whose text is the concatenation of its tokens' bytes (``IncrementalDetokenizer``);
        None for any other (built once per flag)."""
        if self._byte_decoder is None:
            return None
        table = self._byte_tables.get(skip_special_tokens)
        if table is None:
            special = _special_ids(self) if skip_special_tokens else frozenset()
            table = tuple(
                b"" if i in special else _token_bytes.__wrapped__(self, i) for i in range(self.vocab_size)
            )
            self._byte_tables[skip_special_tokens] = table
        return table

    def _eos_ids(self, model_path: Path) -> tuple[int, ...]:
        # generation_config.json lists every id that ends a turn; tokenizer_config names one.
        ids: list[int] = []
        for name in ("generation_config.json", "config.json"):
            value = _read_json(model_path / name).get("eos_token_id")
            ids.extend([value] if isinstance(value, int) else value if isinstance(value, list) else [])
        if self.eos_token is not None:
            token_id = self.tokenizer.token_to_id(self.eos_token)
            if token_id is not None:
                ids.append(token_id)
        return tuple(dict.fromkeys(ids))


def load_tokenizer(model_path: str | Path) -> ModelTokenizer:
    """The cached tokenizer of a model folder (loaded once per process)."""
    with _CACHE_LOCK:  # loads run in worker threads; load each folder once
        return _load(str(Path(model_path).resolve()))


@lru_cache(maxsize=32)
def _load(model_path: str) -> ModelTokenizer:
    return ModelTokenizer(Path(model_path))


@lru_cache(maxsize=1 << 16)
def _token_bytes(tok: ModelTokenizer, token_id: int) -> bytes:
    piece = tok.tokenizer.id_to_token(token_id)
    if piece is None:
        return b""
    if tok._byte_decoder is not None and token_id not in _special_ids(tok):
        try:
            return bytes(tok._byte_decoder[ch] for ch in piece)
        except KeyError:  # an added token written in plain text
            return piece.encode()
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):  # sentencepiece byte
        return bytes([int(piece[3:5], 16)])
    return tok.tokenizer.decode([token_id], skip_special_tokens=False).encode()


@lru_cache(maxsize=32)
def _special_ids(tok: ModelTokenizer) -> frozenset[int]:
    return frozenset(
        token_id for token_id, added in tok.tokenizer.get_added_tokens_decoder().items() if added.special
    )


def _is_byte_level(tokenizer: Tokenizer) -> bool:
    return isinstance(tokenizer.decoder, decoders.ByteLevel)


def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's printable stand-ins for bytes, reversed: character -> byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):  # {"content": "<|im_end|>", ...}
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text())
    except ValueError as exc:
        raise ConfigError(f"{path} is not valid JSON: {exc}") from exc
    return value if isinstance(value, dict) else {}
