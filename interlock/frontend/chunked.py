"""Long texts encoded in chunks whose ids, joined, are the whole text's; chunks seen before cost
nothing.

A long prompt is cut into chunks of about ``CHUNK_CHARS`` at a single space between two
non-space characters (``chunks``). Byte-level BPE tokenizers whose pre-tokenizer is a GPT-2-style
regex (GPT-2, SmolLM2, Llama 3, Qwen2: a space is only ever the first character of a piece) always
split there, and their merges never cross a split, so each chunk's ids are exactly the whole
text's ids over that span. Whether a tokenizer is of that kind is decided once when it is loaded
(``seams_exact``): its ``tokenizer.json`` must match the family (pre-tokenizer, no normalizer
that could join characters across a seam, no added token with spaces or stripping) and a sample
of every kind of text must encode the same whole and cut at every seam. Any other tokenizer (a
SentencePiece model, say) keeps the whole-text encoding.

For the tokenizers that pass, a long prompt costs:

* one pass for the token budget and the ids together (the screen in ``budget.py`` used to encode
  it once to count and again to keep);
* the chunks not seen before, encoded in one ``encode_batch_fast`` call (no offsets, the GIL
  released, the chunks in parallel on the tokenizer's threads);
* nothing for chunks already encoded: the cuts depend only on the text before them, so the next
  turn of a conversation, an agent's growing context or a repeated document re-encodes only what
  is new after the last unchanged chunk (``ChunkCache``, bounded in tokens, least recently used
  out first, keyed by the chunk's string hash and length).

A text with no space between words in some chunk's second half (long runs of CJK text, base64)
is not cut; it is screened and then encoded whole, as before.

A shorter text (a chat under ``CHUNK_CHARS``: a system prompt, earlier turns, the new message)
is cut at its added tokens instead (``AddedTokenCuts``: the turn markers a chat template writes),
where the tokenizer itself cuts before it pre-tokenizes, so the pieces' ids joined are the
text's. Pieces come from the same cache: a conversation's next turn, or any request with a known
system prompt, encodes only the messages new since (``ChunkedEncoder.cut_plan``, ``fill``): a 10-turn,
8,000-character chat 1.8 → 0.28 ms when its last answer and a new question are new
(``benchmarks/chat_encode.py``).
"""

from __future__ import annotations

import json
import operator
import re
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from tokenizers import Tokenizer

CHUNK_CHARS = 16384
"""Characters per chunk (a few thousand tokens)."""
CUT_WINDOW = 1024
"""How far back from a chunk's end a space between words is looked for."""
CACHE_TOKENS = 2_000_000
"""Token ids the chunk cache keeps per tokenizer (8 bytes each, the int objects shared: 16 MB)."""
PARALLEL_CHARS = 8192
"""New text in a cut chat from which its pieces are encoded in one batch, on the tokenizer's
threads (below, one at a time: less CPU; the frontend runs such a text off the event loop)."""
ENTRY_TOKENS = 32
"""What an entry costs beyond its ids, in ids (key, tuple and dict slot: ~260 bytes, 8 a token):
the pieces of short chats are a few tokens each, and a cap counted in ids alone would let
millions of them in."""
PROMPT_CACHE_TOKENS = 1_000_000
"""Token ids of whole long prompts kept for a prompt sent again as it was (8 MB)."""

_SAMPLE = (
    "Hello world, it's 2026! Numbers 12345 67890 3.14159 and -42.  Two  spaces,\tTabs\tand\n"
    "new lines\n\n  indented line; punctuation!? (brackets) [x] {y: 'z'} \"quoted\" it'll we've "
    "I'm they'd you're CAPITALS MixedCase snake_case camelCase URLs https://example.com/a?b=c#d "
    "ünïcödé café naïve Ελληνικά кириллица 中文字符 日本語 한국어 emoji 😀👍🏽 math ∑∫√ "
    "code: def f(x):\n    return x ** 2  # comment\n<|im_start|>user\nhi <|im_end|> "
    "<|endoftext|> <s> </s> [INST] ok [/INST] 0x1F ... --- ___ *** end."
)


def chunks(text: str, size: int = CHUNK_CHARS) -> Iterator[tuple[str, bool]]:
    """``text`` in pieces of at most ``size`` characters; with each, whether the cut after it
    fell at a space between words (True) or inside a word."""
    start = 0
    while len(text) - start > size:
        end = start + size
        cut = _space_between_words(text, max(start + 1, end - CUT_WINDOW), end)
        yield text[start : cut or end], cut is not None
        start = cut or end
    yield text[start:], True


def soft_pieces(text: str, size: int = CHUNK_CHARS) -> list[str] | None:
    """``text`` in pieces of at most ``size`` characters, each cut at the last space between
    words in its second half; None when a piece has none there (long runs without spaces)."""
    pieces: list[str] = []
    start = 0
    while len(text) - start > size:
        cut = _space_between_words(text, start + size // 2, start + size)
        if cut is None:
            return None
        pieces.append(text[start:cut])
        start = cut
    pieces.append(text[start:])
    return pieces


def _space_between_words(text: str, low: int, high: int) -> int | None:
    k = text.rfind(" ", low, high)
    while k > low:
        if not text[k - 1].isspace() and not text[k + 1].isspace():
            return k
        k = text.rfind(" ", low, k)
    return None


def seams_exact(tokenizer: Tokenizer, spec: dict[str, Any]) -> bool:
    """Whether cutting a text at ``chunks``' soft cuts leaves its ids unchanged (module note).
    ``spec``: the tokenizer's ``tokenizer.json``."""
    if spec.get("normalizer") not in (None, {"type": "NFC"}):
        return False
    for added in spec.get("added_tokens") or ():
        content = str(added.get("content", ""))
        if added.get("lstrip") or added.get("rstrip") or any(c.isspace() for c in content):
            return False
    if not _gpt2_style(spec.get("pre_tokenizer")):
        return False
    words = _SAMPLE * 3
    whole = tokenizer.encode_batch_fast([words], add_special_tokens=False)[0].ids
    for size in (64, 101, 160, 257):
        pieces = soft_pieces(words, size)
        if pieces is None:
            return False
        joined = [i for e in tokenizer.encode_batch_fast(pieces, add_special_tokens=False) for i in e.ids]
        if joined != whole:
            return False
    return True


def _gpt2_style(pre: Any) -> bool:
    """A byte-level pre-tokenizer splitting by a GPT-2-style regex, alone (``use_regex``) or as
    a ``Split`` (Llama 3, Qwen2) before a regex-free byte-level step."""
    if not isinstance(pre, dict):
        return False
    if pre.get("type") == "ByteLevel":
        return bool(pre.get("use_regex", True))
    if pre.get("type") != "Sequence":
        return False
    steps = pre.get("pretokenizers") or []
    if not steps or steps[-1].get("type") != "ByteLevel" or steps[-1].get("use_regex", True):
        return False
    splits = steps[:-1]
    return bool(splits) and all(
        s.get("type") == "Split"
        and s.get("behavior") == "Isolated"
        and not s.get("invert")
        and "Regex" in (s.get("pattern") or {})
        for s in splits
    )


def special_prefix(tokenizer: Tokenizer) -> list[int] | None:
    """The ids ``add_special_tokens=True`` puts in front of a text, when that is all it does
    (a BOS); None when it adds anything after the text too."""
    prefix = tokenizer.encode("", add_special_tokens=True).ids
    probe = "special tokens probe"
    with_specials = tokenizer.encode(probe, add_special_tokens=True).ids
    without = tokenizer.encode(probe, add_special_tokens=False).ids
    return list(prefix) if with_specials == [*prefix, *without] else None


class AddedTokenCuts:
    """A text cut at the tokenizer's added tokens (longest first, as the tokenizer matches
    them): ``split`` gives the texts between them at even positions and the tokens at odd ones.
    Only tokens matched on the raw text (not normalized, not single-word, no stripping) cut."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        tokens = [
            t
            for t in tokenizer.get_added_tokens_decoder().values()
            if t.content and not (t.normalized or t.single_word or t.lstrip or t.rstrip)
        ]
        ids = {t.content: tokenizer.token_to_id(t.content) for t in tokens}
        self.ids: dict[str, int] = {c: i for c, i in ids.items() if i is not None}
        self._unmapped = len(ids) - len(self.ids)
        contents = sorted(self.ids, key=len, reverse=True)
        self._pattern = re.compile("(" + "|".join(map(re.escape, contents)) + ")") if contents else None

    def split(self, text: str) -> list[str]:
        return self._pattern.split(text) if self._pattern is not None else [text]

    def exact(self, tokenizer: Tokenizer) -> bool:
        """Whether the pieces' ids joined are the whole text's on a sample with every added
        token between words, inside words and next to each other."""
        if not self.ids or self._unmapped:
            return False
        marks = list(self.ids)
        sample = _SAMPLE + "".join(
            f" x{m}y {m}\n{m}{marks[(i + 1) % len(marks)]} z {m}" for i, m in enumerate(marks)
        )
        whole = tokenizer.encode_batch_fast([sample], add_special_tokens=False)[0].ids
        return self.encode(tokenizer, sample) == whole

    def encode(self, tokenizer: Tokenizer, text: str) -> list[int]:
        """``text``'s ids piece by piece, with no cache (the reference ``exact`` checks)."""
        parts = self.split(text)
        encoded = tokenizer.encode_batch_fast(parts[0::2], add_special_tokens=False)
        return self.join(parts, [e.ids for e in encoded])

    def join(self, parts: list[str], pieces: Sequence[Sequence[int]]) -> list[int]:
        """The text's ids: each text part's ids (``pieces``, in order) with the added tokens'
        between them."""
        out: list[int] = []
        for i, ids in enumerate(pieces):
            if i:
                out.append(self.ids[parts[2 * i - 1]])
            out.extend(ids)
        return out


Key = tuple[int, int]
"""A chunk's cache key (``ChunkCache.key``)."""


class ChunkCache:
    """Key -> ids (a tuple), least recently used out first, at most ``capacity`` ids counting
    ``ENTRY_TOKENS`` for each entry's own cost.
    Thread-safe (a tokenizer is shared by every event loop of the process)."""

    def __init__(self, capacity: int = CACHE_TOKENS) -> None:
        self.capacity = capacity
        self.tokens = 0
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[Key, tuple[int, ...]] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def key(chunk: str) -> Key:
        """Python's keyed 64-bit string hash (SipHash, a random key per process, so no client
        can aim for a collision) with the length: 0.1 ms for a 60k-token prompt, against 1 ms
        for a BLAKE2 digest of its bytes."""
        return hash(chunk), len(chunk)

    def get(self, key: Key) -> tuple[int, ...] | None:
        with self._lock:
            ids = self._entries.get(key)
            if ids is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return ids

    def put(self, key: Key, ids: Sequence[int]) -> None:
        if len(ids) + ENTRY_TOKENS > self.capacity:
            return
        packed = tuple(ids)
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.tokens -= len(old) + ENTRY_TOKENS
            self._entries[key] = packed
            self.tokens += len(packed) + ENTRY_TOKENS
            while self.tokens > self.capacity:
                _, out = self._entries.popitem(last=False)
                self.tokens -= len(out) + ENTRY_TOKENS

    def __len__(self) -> int:
        return len(self._entries)


Plan = tuple[list[str], list[Key], list["tuple[int, ...] | None"]]
"""A text's pieces, their cache keys, and the cached ids of each (None: not cached)."""


@dataclass
class CutPlan:
    """A short text cut at its added tokens (``ChunkedEncoder.cut_plan``): the parts (texts at
    even positions, added tokens at odd), each text's cached ids (None: to encode), the parts
    to encode and their characters."""

    parts: list[str]
    found: list[tuple[int, ...] | None]
    missing: list[int]
    missing_chars: int


class ChunkedEncoder:
    """A long text's ids from its chunks: cached ones looked up, the rest encoded in one call."""

    def __init__(self, tokenizer: Tokenizer, cache: ChunkCache | None = None) -> None:
        self.tokenizer = tokenizer
        self.cache = cache if cache is not None else ChunkCache()
        self.prompts = ChunkCache(PROMPT_CACHE_TOKENS)
        """Whole prompts' ids (``prompt_key``): one sent again costs a lookup, and its ids are
        the same tuple, whose block hashes the router keeps."""
        self._ints = tuple(range(tokenizer.get_vocab_size(with_added_tokens=True)))
        """One int object per token id: cached ids point at these (8 bytes a token, not 36)."""
        cuts = AddedTokenCuts(tokenizer)
        self.cuts = cuts if cuts.exact(tokenizer) else None
        """Cuts at added tokens for texts under a chunk (``cut_plan``, ``fill``); None where they
        would change the ids."""

    @staticmethod
    def prompt_key(text: str, add_special_tokens: bool) -> Key:
        return hash((text, add_special_tokens)), len(text)

    def shared(self, ids: list[int]) -> tuple[int, ...]:
        """``ids`` as a tuple of the shared int objects."""
        if len(ids) < 2:
            return tuple(self._ints[i] for i in ids)
        return operator.itemgetter(*ids)(self._ints)  # type: ignore[no-any-return]

    def plan(self, text: str) -> Plan | None:
        """The text's pieces, their keys and what the cache has of each; None when it has no
        soft pieces (run it off the event loop: it reads the whole text)."""
        pieces = soft_pieces(text)
        if pieces is None:
            return None
        keys = [ChunkCache.key(p) for p in pieces]
        return pieces, keys, [self.cache.get(k) for k in keys]

    def encode(self, pieces: list[str]) -> list[tuple[int, ...]]:
        """Ids of each piece, special tokens left out (releases the GIL; run it in a thread)."""
        return [
            self.shared(e.ids) for e in self.tokenizer.encode_batch_fast(pieces, add_special_tokens=False)
        ]

    def cut_plan(self, text: str) -> CutPlan | None:
        """A short text cut at its added tokens, with what the cache has of each piece; None
        without exact cuts (``fill`` finishes it)."""
        cuts = self.cuts
        if cuts is None:
            return None
        parts = cuts.split(text)
        found: list[tuple[int, ...] | None] = []
        missing: list[int] = []
        for i in range(0, len(parts), 2):
            piece = parts[i]
            ids = self.cache.get(ChunkCache.key(piece)) if piece else ()
            if ids is None:
                missing.append(i)
            found.append(ids)
        return CutPlan(parts, found, missing, sum(len(parts[i]) for i in missing))

    def fill(self, plan: CutPlan) -> tuple[int, ...]:
        """The planned text's ids (special tokens left out): the pieces not cached encoded in
        one call (releases the GIL) and kept."""
        assert self.cuts is not None
        parts, found = plan.parts, plan.found
        if plan.missing:
            texts = [parts[i] for i in plan.missing]
            if plan.missing_chars >= PARALLEL_CHARS:  # the tokenizer's threads take the pieces
                batch = self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)
            else:  # a batch of a few short pieces costs ~45% more CPU on its threads than one text
                batch = [self.tokenizer.encode_batch_fast([t], add_special_tokens=False)[0] for t in texts]
            for i, e in zip(plan.missing, batch, strict=True):
                new = found[i // 2] = self.shared(e.ids)
                self.cache.put(ChunkCache.key(parts[i]), new)
        # the cached pieces' shared int objects, and the added tokens' ids; every None filled above
        return tuple(self.cuts.join(parts, found))  # type: ignore[arg-type]

    def store(self, keys: list[Key], encoded: list[tuple[int, ...]]) -> None:
        for key, ids in zip(keys, encoded, strict=True):
            self.cache.put(key, ids)


def read_spec(tokenizer: Tokenizer) -> dict[str, Any]:
    """The tokenizer's own JSON description (what ``tokenizer.json`` holds)."""
    value = json.loads(tokenizer.to_str())
    return value if isinstance(value, dict) else {}


def pipeline_spec(tokenizer: Tokenizer) -> dict[str, Any]:
    """The parts of ``read_spec`` that ``seams_exact`` reads (normalizer, pre-tokenizer, added
    tokens), without the model's vocabulary and merges: SmolLM2's whole description as Python
    objects left ~3 MiB in the frontend's memory after it was dropped (a tokenizer's load 34 →
    31 MiB)."""

    def part(component: Any) -> Any:
        return json.loads(component.__getstate__()) if component is not None else None

    added = [
        {"id": i, "content": t.content, "lstrip": t.lstrip, "rstrip": t.rstrip, "special": t.special}
        for i, t in sorted(tokenizer.get_added_tokens_decoder().items())
    ]
    return {
        "normalizer": part(tokenizer.normalizer),
        "pre_tokenizer": part(tokenizer.pre_tokenizer),
        "added_tokens": added,
    }
