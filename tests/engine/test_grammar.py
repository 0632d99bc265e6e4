"""GrammarCompiler and Matcher on the default model's vocabulary: compile and cache, refusals
that name the request's parameter, a walk of a valid document, a refused token, rollback and
rebuild (a matcher rebuilt from a token list is the one that accepted them one by one)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from tokenizers import Tokenizer

from interlock.engine.grammar import CompiledGrammar, GrammarCompiler, GrammarLimits, Matcher
from interlock.errors import InvalidRequest
from interlock.model_store import resolve_model
from interlock.protocol import StructuredOutput

EOS = 2
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
DOC = {"name": "Ada Lovelace", "age": 36, "tags": ["b", "a"]}


@pytest.fixture(scope="module")
def folder():  # type: ignore[no-untyped-def]
    return resolve_model("smollm2", progress=False)


@pytest.fixture(scope="module")
def compiler(folder) -> GrammarCompiler:  # type: ignore[no-untyped-def]
    return GrammarCompiler.from_folder(folder, eos_token_ids=(EOS,))


@pytest.fixture(scope="module")
def tokenizer(folder) -> Tokenizer:  # type: ignore[no-untyped-def]
    return Tokenizer.from_file(str(folder / "tokenizer.json"))


def schema(value: object = PERSON) -> StructuredOutput:
    return StructuredOutput(kind="json_schema", spec=json.dumps(value))


def allowed(matcher: Matcher, words: int) -> set[int]:
    bitmask = np.zeros((1, words), dtype=np.int32)
    matcher.fill_mask(bitmask, 0)
    bits = np.unpackbits(bitmask.view(np.uint8), bitorder="little")
    return set(np.flatnonzero(bits).tolist())


def encode(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


def test_compile_is_cached_by_kind_and_spec(compiler: GrammarCompiler) -> None:
    hits, misses = compiler.hits, compiler.misses
    first = compiler.compile(schema({**PERSON, "title": "cache"}))
    again = compiler.compile(
        StructuredOutput(kind="json_schema", spec=json.dumps({**PERSON, "title": "cache"}))
    )
    assert isinstance(first, CompiledGrammar) and again is first
    assert (compiler.hits - hits, compiler.misses - misses) == (1, 1)
    other = compiler.compile(schema({**PERSON, "title": "other"}))
    assert other is not first and compiler.misses - misses == 2
    # the kind is part of the key: the same text under another kind is another grammar
    text = 'start: "x"'  # a grammar, and a regex that matches itself
    assert compiler.compile(StructuredOutput(kind="regex", spec=text)).kind == "regex"
    assert compiler.compile(StructuredOutput(kind="grammar", spec=text)).kind == "grammar"


def test_cache_is_bounded_lru(folder) -> None:  # type: ignore[no-untyped-def]
    small = GrammarCompiler.from_folder(folder, eos_token_ids=(EOS,), limits=GrammarLimits(cache_size=2))
    a, b = (small.compile(StructuredOutput(kind="regex", spec=s)) for s in ("a+", "b+"))
    assert small.compile(StructuredOutput(kind="regex", spec="a+")) is a  # a is now the newest
    small.compile(StructuredOutput(kind="regex", spec="c+"))  # evicts b
    assert small.compile(StructuredOutput(kind="regex", spec="a+")) is a
    assert small.compile(StructuredOutput(kind="regex", spec="b+")) is not b


@pytest.mark.parametrize(
    ("kind", "spec", "words"),
    [
        ("json_schema", '{"type": "objectz"}', "objectz"),
        ("json_schema", "{not json", "not valid JSON"),
        ("json_schema", "[1, 2]", "must be an object"),
        ("regex", "a(b", "unclosed group"),
        ("grammar", 'start: foo\nfoo: "a" bar', "bar"),
        ("choice", "[]", "non-empty list"),
        ("choice", '["a", 3]', "non-empty list"),
        ("xml", "", "unknown structured output kind"),
    ],
)
def test_bad_spec_is_an_invalid_request_naming_the_parameter(
    compiler: GrammarCompiler, kind: str, spec: str, words: str
) -> None:
    with pytest.raises(InvalidRequest) as err:
        compiler.compile(StructuredOutput(kind=kind, spec=spec))
    assert err.value.param == "response_format" and err.value.status == 400
    assert words in err.value.message
    with pytest.raises(InvalidRequest) as err:
        compiler.compile(StructuredOutput(kind=kind, spec=spec), param="structured_outputs")
    assert err.value.param == "structured_outputs"


def test_a_spec_over_the_length_limit_is_refused_before_parsing(folder) -> None:  # type: ignore[no-untyped-def]
    small = GrammarCompiler.from_folder(
        folder, eos_token_ids=(EOS,), limits=GrammarLimits(max_spec_chars=100)
    )
    with pytest.raises(InvalidRequest, match="too long"):
        small.compile(StructuredOutput(kind="regex", spec="a" * 101))
    assert small.misses == 0


def test_a_valid_document_is_accepted_token_by_token_then_only_eos(
    compiler: GrammarCompiler, tokenizer: Tokenizer
) -> None:
    matcher = compiler.new_matcher(compiler.compile(schema()))
    for token in encode(tokenizer, json.dumps(DOC)):
        assert not matcher.is_terminated
        assert token in allowed(matcher, compiler.mask_words)
        assert matcher.accept(token)
    assert matcher.is_accepting  # and, the object closed, nothing but EOS can follow
    assert allowed(matcher, compiler.mask_words) == {EOS}
    assert matcher.accept(EOS) and matcher.is_terminated


@pytest.mark.parametrize(
    ("kind", "spec", "text"),
    [
        ("json_object", "", '{"ok": [1, 2, {"deep": null}], "why": "yes"}'),
        ("regex", r"[0-9]{3}-[a-z]+", "123-abc"),
        ("choice", '["positive", "negative"]', "negative"),
        ("grammar", 'start: "yes" | "no" | "maybe " NUM\nNUM: /[0-9]+/', "maybe 42"),
        ("grammar", 'root ::= "(" [a-c]+ ")"', "(abcab)"),  # GBNF
    ],
)
def test_every_kind_accepts_a_valid_output(
    compiler: GrammarCompiler, tokenizer: Tokenizer, kind: str, spec: str, text: str
) -> None:
    matcher = compiler.new_matcher(compiler.compile(StructuredOutput(kind=kind, spec=spec)))
    for token in encode(tokenizer, text):
        assert token in allowed(matcher, compiler.mask_words), (kind, tokenizer.decode([token]))
        assert matcher.accept(token)
    assert EOS in allowed(matcher, compiler.mask_words)


def test_a_token_outside_the_grammar_is_refused(compiler: GrammarCompiler, tokenizer: Tokenizer) -> None:
    matcher = compiler.new_matcher(compiler.compile(schema()))
    for token in encode(tokenizer, '{"name": "A"'):
        assert matcher.accept(token)
    (bad,) = encode(tokenizer, "}")  # "age" is required next
    assert bad not in allowed(matcher, compiler.mask_words)
    assert not matcher.accept(bad)
    assert matcher.error and len(matcher.tokens) == len(encode(tokenizer, '{"name": "A"'))
    assert allowed(matcher, compiler.mask_words) == set()  # the caller decides (Constraints: EOS)


def test_eos_before_the_end_is_refused(compiler: GrammarCompiler) -> None:
    matcher = compiler.new_matcher(compiler.compile(schema()))
    assert EOS not in allowed(matcher, compiler.mask_words)
    assert not matcher.accept(EOS)


def test_rebuild_and_rollback_equal_the_incremental_walk(
    compiler: GrammarCompiler, tokenizer: Tokenizer
) -> None:
    tokens = encode(tokenizer, json.dumps(DOC))
    compiled = compiler.compile(schema())
    walked = compiler.new_matcher(compiled)
    masks = []
    for token in tokens:
        masks.append(allowed(walked, compiler.mask_words))
        walked.accept(token)
    for cut in (0, 1, len(tokens) // 2, len(tokens)):
        rebuilt = compiler.new_matcher(compiled, tokens[:cut])  # e.g. after preemption or migration
        assert rebuilt.tokens == tokens[:cut]
        for k in range(cut, len(tokens)):
            assert allowed(rebuilt, compiler.mask_words) == masks[k]
            assert rebuilt.accept(tokens[k])
        assert rebuilt.tokens == walked.tokens
    rolled = compiler.new_matcher(compiled, tokens)
    rolled.rollback(5)
    assert rolled.tokens == tokens[:-5]
    assert allowed(rolled, compiler.mask_words) == masks[len(tokens) - 5]


def test_a_matcher_cannot_be_rebuilt_from_tokens_the_grammar_refuses(
    compiler: GrammarCompiler, tokenizer: Tokenizer
) -> None:
    compiled = compiler.compile(schema())
    with pytest.raises(InvalidRequest, match="does not match"):
        compiler.new_matcher(compiled, encode(tokenizer, "hello"))
    matcher = compiler.new_matcher(compiled)
    assert not matcher.rebuild(encode(tokenizer, "hello")) and matcher.error


def test_hostile_specs_compile_within_bounds(compiler: GrammarCompiler) -> None:
    """What makes other engines take seconds (bounded repetition) compiles in milliseconds."""
    for spec in (
        {"type": "string", "minLength": 5, "maxLength": 5000},
        {"type": "string", "minLength": 100000},
        {"enum": [f"v{i}" for i in range(20000)]},
    ):
        matcher = compiler.new_matcher(compiler.compile(schema(spec)))
        assert allowed(matcher, compiler.mask_words)


def test_importing_the_compiler_does_not_import_torch() -> None:
    """The frontend imports it to refuse a bad spec; it must stay light."""
    code = "import sys, interlock.engine.grammar; assert 'torch' not in sys.modules, 'torch'"
    subprocess.run([sys.executable, "-c", code], check=True)
