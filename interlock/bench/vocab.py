"""Deterministic token blocks and their text: with a real tokenizer (exact) or without (approximate).

A synthetic prompt is built from blocks, each named by a string key (``"prefix:2"`` for a
shared-prefix group; trace prompts index the pool instead, see ``interlock.mooncake``). A block is drawn from a seeded RNG over a *pool* of
token ids, so the same key gives the same ids, and the same text, in every process and run.

Exactness: the pool holds only tokens whose text is a space followed by letters (``" word"``)
and which encode back to that single id. Byte-level BPE and SentencePiece tokenizers split text
at spaces before merging, so the concatenated text of pool tokens re-encodes to exactly the
same ids: a prompt sent as text has the token count we intended, and block boundaries stay
token boundaries, so shared prefixes stay shared after the server tokenizes.

Without a tokenizer, :class:`WordVocab` uses a fixed list of common English words; one word is
roughly one token for common tokenizers (approximate mode: lengths are estimates).
"""

from __future__ import annotations

import os
import random
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from interlock.errors import ConfigError

_WORD = re.compile(r"^ [a-z]{2,10}$")
POOL_LIMIT = 8000
"""Lower ids first: in BPE vocabularies they are the earlier, more common merges."""

COMMON_WORDS = (
    "the of and to in is was for on are with as by at from his her they this that have but not "
    "all were one had there can their been has more time will would about some into them these "
    "other new first could very after most made also over did many before must where much your "
    "way well down should because long each just those people how too little state good very "
    "make world still own see men work long here between both life being under never day same "
    "another know while last might great old year off come since against go came right used take "
    "three small house water place hand part high around city line young give night point name "
    "thing home left number side once light plan order open field power group model table mind"
).split()


class Vocab(Protocol):
    exact: bool
    """True when lengths are token-exact (a real tokenizer built the pool)."""
    pool: Sequence[int]
    """The token ids prompts are drawn from (trace blocks index into it)."""

    def block(self, key: str, n: int) -> list[int]: ...

    def text(self, ids: Sequence[int]) -> str: ...

    def count(self, text: str) -> int: ...


class WordVocab:
    """Approximate mode: ids index ``COMMON_WORDS``; one word counts as one token."""

    exact = False

    def __init__(self) -> None:
        self._words = tuple(dict.fromkeys(COMMON_WORDS))
        self.pool: Sequence[int] = range(len(self._words))

    def block(self, key: str, n: int) -> list[int]:
        return random.Random(key).choices(self.pool, k=n)

    def text(self, ids: Sequence[int]) -> str:
        return "".join(" " + self._words[i] for i in ids)

    def count(self, text: str) -> int:
        return len(text.split())


class TokenizerVocab:
    """Exact mode over a local Hugging Face tokenizer folder (``tokenizer.json``)."""

    exact = True

    def __init__(self, folder: str | Path) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a tokenizer folder is local; never reach a hub
        from tokenizers import Tokenizer

        path = Path(folder)
        path = path / "tokenizer.json" if path.is_dir() else path
        if not path.is_file():
            raise ConfigError(f"no tokenizer.json at {folder}")
        self._tok = Tokenizer.from_file(str(path))
        self.pool: Sequence[int] = self._word_pool()
        if len(self.pool) < 50:
            raise ConfigError(f"tokenizer {folder} has too few plain word tokens ({len(self.pool)})")

    def _word_pool(self) -> list[int]:
        candidates: list[tuple[int, str]] = []
        for token_id in sorted(self._tok.get_vocab().values()):
            text = self._tok.decode([token_id])
            if _WORD.match(text):
                candidates.append((token_id, text))
            if len(candidates) >= POOL_LIMIT:
                break
        encoded = self._tok.encode_batch([t for _, t in candidates], add_special_tokens=False)
        return [tid for (tid, _), enc in zip(candidates, encoded, strict=True) if enc.ids == [tid]]

    def block(self, key: str, n: int) -> list[int]:
        return random.Random(key).choices(self.pool, k=n)

    def text(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)


def load_vocab(tokenizer: str | Path | None) -> Vocab:
    """A tokenizer folder gives exact lengths; ``None`` gives the approximate word vocabulary."""
    return TokenizerVocab(tokenizer) if tokenizer else WordVocab()
