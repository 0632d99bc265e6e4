"""Structured outputs: compile a request's output constraint once, then match tokens against it.

A constraint is a ``(kind, spec)`` pair (``protocol.StructuredOutput``): ``json_schema`` (the
schema's JSON text), ``json_object`` (any JSON object; spec ""), ``regex``, ``choice`` (a JSON list
of strings) or ``grammar`` (Lark or GBNF/EBNF). The grammar engine is llguidance, chosen by
measurement (``benchmarks/grammar_mask.py``; docs/design.md, "Structured outputs: the grammar
engine"): sub-millisecond compiles, ~20 µs per token mask on a 49k vocabulary, every kind above,
no dependencies and no torch, so the frontend imports this module to refuse a bad spec before
any work and the engine uses it to enforce the spec.

JSON is held to one layout, json.dumps's (``", "`` and ``": "``, no other whitespace): free
whitespace lets a small model pad its output with newlines until ``max_tokens``.

Bounds against hostile specs: the spec's length (``GrammarLimits.max_spec_chars``) is checked
before anything is parsed; llguidance's own limits (``LLParserLimits``: regex fuel when the
grammar is built, lexer fuel and parser items per token, lexer states, grammar size) are set
tighter than its defaults, so compiling is bounded in time and memory and one request's mask
can never take a step hostage. A spec over a limit is refused like a bad one.

Compiled grammars are cached by ``(kind, spec)`` in a bounded LRU (compiling is the expensive
part; a request starts from a copy of the compiled matcher, a few µs). ``compile`` is safe to
call from several threads (llguidance drops the GIL while it builds).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import llguidance
import numpy as np

from interlock.errors import InvalidRequest
from interlock.protocol.sampling import STRUCTURED_KINDS

JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class StructuredSpec(Protocol):
    """What is compiled: ``protocol.StructuredOutput`` (or anything with its two fields)."""

    @property
    def kind(self) -> str: ...

    @property
    def spec(self) -> str: ...


@dataclass(frozen=True, slots=True)
class GrammarLimits:
    cache_size: int = 256
    """Compiled grammars kept (LRU)."""
    max_spec_chars: int = 256 * 1024
    """Longest spec compiled at all."""
    initial_lexer_fuel: int = 500_000
    """Regex work while building the grammar (~50k per ms): about 10 ms (llguidance: 1M)."""
    step_lexer_fuel: int = 100_000
    """Lexer work per token mask (~14k per ms): about 7 ms (llguidance: 200k)."""
    step_max_items: int = 20_000
    """Earley items per token mask (~20k per ms): about 1 ms (llguidance: 50k)."""
    max_lexer_states: int = 50_000
    """Lexer states per matcher (1-2 kB each): at most ~100 MB (llguidance: 250k)."""
    max_grammar_size: int = 200_000
    """Grammar symbols after expansion (llguidance: 500k)."""

    def parser_limits(self) -> llguidance.LLParserLimits:
        return llguidance.LLParserLimits(
            initial_lexer_fuel=self.initial_lexer_fuel,
            step_lexer_fuel=self.step_lexer_fuel,
            step_max_items=self.step_max_items,
            max_lexer_states=self.max_lexer_states,
            max_grammar_size=self.max_grammar_size,
        )


@dataclass(frozen=True, eq=False, slots=True)
class CompiledGrammar:
    """A constraint checked against the vocabulary; requests start from copies of ``_start``."""

    kind: str
    spec: str
    _start: llguidance.LLMatcher


class Matcher:
    """One request's position in its grammar: the tokens it accepted, in order.

    ``tokens`` is what ``rebuild`` compares against: a matcher started again from the same
    tokens (after preemption, or on another worker with ``resume_token_ids``) is in the same
    state as one that accepted them one by one.
    """

    def __init__(self, compiled: CompiledGrammar) -> None:
        self.compiled = compiled
        self._matcher = compiled._start.deep_copy()
        self.tokens: list[int] = []

    def fill_mask(self, bitmask: np.ndarray, row: int) -> None:
        """Write the allowed next tokens into ``bitmask[row]`` (int32, one bit per token id,
        little-endian; its length is the compiler's ``mask_words``). When the grammar is
        complete only EOS is allowed; in error (a refused token), nothing (the caller decides)."""
        target = bitmask[row]
        assert target.dtype == np.int32 and target.flags["C_CONTIGUOUS"]
        if self._matcher.is_error():
            target.fill(0)
            return
        self._matcher.unsafe_compute_mask_ptr(target.ctypes.data, target.nbytes)

    def accept(self, token_id: int) -> bool:
        """Advance by ``token_id``; False (and the matcher in error) if the grammar refuses it."""
        ok = self._matcher.consume_token(token_id)
        if ok:
            self.tokens.append(token_id)
        return bool(ok)

    def rollback(self, num_tokens: int) -> None:
        """Forget the last ``num_tokens`` accepted tokens."""
        if num_tokens <= 0:
            return
        if num_tokens > len(self.tokens) or not self._matcher.rollback(num_tokens):
            self.rebuild(self.tokens[: max(0, len(self.tokens) - num_tokens)])
            return
        del self.tokens[len(self.tokens) - num_tokens :]

    def rebuild(self, token_ids: Sequence[int]) -> bool:
        """Start again and accept ``token_ids`` (False: the grammar refuses them; in error)."""
        self._matcher = self.compiled._start.deep_copy()
        self.tokens = []
        return all(self.accept(t) for t in token_ids)

    @property
    def is_terminated(self) -> bool:
        """The grammar is complete and EOS was accepted, or nothing more can follow."""
        return bool(self._matcher.is_stopped())

    @property
    def is_accepting(self) -> bool:
        """What was accepted so far is a complete output (EOS is allowed now)."""
        return bool(self._matcher.is_accepting())

    @property
    def error(self) -> str:
        """Why the matcher is in error ("" when it is not)."""
        return self._matcher.get_error() if self._matcher.is_error() else ""


class GrammarCompiler:
    """Compiles constraints for one vocabulary (a model's ``tokenizer.json``)."""

    def __init__(
        self,
        tokenizer_json: str,
        *,
        eos_token_ids: Sequence[int],
        vocab_size: int | None = None,
        limits: GrammarLimits = GrammarLimits(),
    ) -> None:
        """``vocab_size``: the model's (its logits' width) where it pads the tokenizer's
        vocabulary; ids past the tokenizer's are never allowed."""
        if not eos_token_ids:
            raise ValueError("a grammar needs at least one EOS token id")
        self.tokenizer = llguidance.LLTokenizer(
            tokenizer_json, n_vocab=vocab_size, eos_token=list(eos_token_ids)
        )
        self.vocab_size: int = self.tokenizer.vocab_size
        self.mask_words = (self.vocab_size + 31) // 32
        self.eos_token_ids = tuple(eos_token_ids)
        self.limits = limits
        self._parser_limits = limits.parser_limits()
        self._cache: OrderedDict[tuple[str, str], CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @classmethod
    def from_folder(
        cls,
        folder: Path,
        *,
        eos_token_ids: Sequence[int],
        vocab_size: int | None = None,
        limits: GrammarLimits = GrammarLimits(),
    ) -> GrammarCompiler:
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"{folder} has no tokenizer.json")
        return cls(path.read_text(), eos_token_ids=eos_token_ids, vocab_size=vocab_size, limits=limits)

    def compile(self, structured: StructuredSpec, *, param: str = "response_format") -> CompiledGrammar:
        """The compiled constraint (cached); InvalidRequest naming ``param`` for a bad one."""
        key = (structured.kind, structured.spec)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                self.hits += 1
                return hit
        compiled = self._compile(*key, param=param)
        with self._lock:
            self.misses += 1
            self._cache[key] = compiled
            self._cache.move_to_end(key)
            while len(self._cache) > self.limits.cache_size:
                self._cache.popitem(last=False)
        return compiled

    def new_matcher(self, compiled: CompiledGrammar, token_ids: Sequence[int] = ()) -> Matcher:
        """A request's matcher, having accepted ``token_ids`` (its output so far)."""
        matcher = Matcher(compiled)
        if token_ids and not matcher.rebuild(token_ids):
            raise InvalidRequest(f"the output so far does not match the {compiled.kind} constraint")
        return matcher

    def _compile(self, kind: str, spec: str, *, param: str) -> CompiledGrammar:
        if len(spec) > self.limits.max_spec_chars:
            raise InvalidRequest(
                f"the {kind} is too long ({len(spec)} characters; at most {self.limits.max_spec_chars})",
                param=param,
            )
        grammar = _grammar(kind, spec, param)
        start = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0, limits=self._parser_limits)
        if start.is_error():
            raise InvalidRequest(f"invalid {_NAMES[kind]}: {_one_line(start.get_error())}", param=param)
        return CompiledGrammar(kind, spec, start)


_NAMES = {
    "json_schema": "JSON schema",
    "json_object": "JSON object",
    "regex": "regex",
    "choice": "choice list",
    "grammar": "grammar",
}


def _grammar(kind: str, spec: str, param: str) -> str:
    """llguidance's grammar text for a constraint (not yet checked against anything)."""
    if kind == "json_object":
        return llguidance.LLMatcher.grammar_from_json_schema('{"type": "object"}', defaults=JSON_LAYOUT)  # type: ignore[arg-type]
    if kind == "json_schema":
        schema = _json(spec, "JSON schema", param)
        if not isinstance(schema, dict):
            raise InvalidRequest("the JSON schema must be an object", param=param)
        return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_LAYOUT)  # type: ignore[arg-type]
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(spec)
    if kind == "choice":
        choices = _json(spec, "choice list", param)
        if not isinstance(choices, list) or not choices or not all(isinstance(c, str) and c for c in choices):
            raise InvalidRequest("choice must be a non-empty list of non-empty strings", param=param)
        return llguidance.grammar_from("choice", spec)
    if kind == "grammar":
        try:
            return llguidance.grammar_from("grammar", spec)
        except ValueError as exc:
            raise InvalidRequest(f"invalid grammar: {_one_line(str(exc))}", param=param) from None
    raise InvalidRequest(
        f"unknown structured output kind {kind!r} (one of {', '.join(STRUCTURED_KINDS)})", param=param
    )


def _json(spec: str, what: str, param: str) -> object:
    try:
        return json.loads(spec)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise InvalidRequest(f"the {what} is not valid JSON: {exc}", param=param) from None


def _one_line(message: str) -> str:
    """An engine's message on one line (its regex errors draw a caret over several)."""
    text = " ".join(part.strip() for part in message.splitlines() if part.strip())
    return text[:400] or "refused by the grammar engine"
