"""model_store: names, GGUF files and HF folders resolve to a validated local folder."""

from __future__ import annotations

import hashlib
import json
import re
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from interlock.cli import convert
from interlock.errors import ConfigError
from interlock.model_store import (
    DEFAULT_MODEL,
    Converter,
    ModelStore,
    resolve_model,
    safe_model_name,
    served_model_name,
)
from interlock.model_store.cache import (
    CHUNK,
    CHUNKS,
    MANIFEST,
    WHOLE_MAX,
    SourceDigests,
    entry_key,
    entry_problem,
    sample_sha256,
)


def _folder(tmp_path: Path, architectures: list[str], weights: bool = True) -> Path:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": architectures}))
    if weights:
        (tmp_path / "model.safetensors").write_bytes(b"")
    return tmp_path


def test_default_model_is_a_complete_bf16_folder() -> None:
    folder = resolve_model(DEFAULT_MODEL, progress=False)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json"):
        assert (folder / name).is_file(), name
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in tokenizer_config["chat_template"]
    assert json.loads((folder / "config.json").read_text())["dtype"] == "bfloat16"
    assert served_model_name(folder) == "SmolLM2-135M-Instruct"


def test_aliases_resolve_to_the_same_folder() -> None:
    assert resolve_model("SmolLM2-135M-Instruct", progress=False) == resolve_model("smollm2", progress=False)


def test_hf_folder_is_returned_as_is(tmp_path: Path) -> None:
    folder = _folder(tmp_path, ["Qwen2ForCausalLM"])
    assert resolve_model(str(folder)) == folder.resolve()


@pytest.mark.parametrize(
    ("architectures", "weights", "message"),
    [(["GPT2LMHeadModel"], True, "not supported"), (["LlamaForCausalLM"], False, "safetensors")],
)
def test_bad_folders_are_config_errors(
    tmp_path: Path, architectures: list[str], weights: bool, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve_model(str(_folder(tmp_path, architectures, weights)))


def test_folder_without_config_and_unknown_names_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config.json"):
        resolve_model(str(tmp_path))
    with pytest.raises(ConfigError, match="known name"):
        resolve_model("no-such-model")


def test_convert_cli_prints_the_folder(capsys: pytest.CaptureFixture[str]) -> None:
    assert convert.main(["smollm2", "--quiet"]) == 0
    assert capsys.readouterr().out.strip() == str(resolve_model("smollm2"))
    assert convert.main(["no-such-model"]) == 2


def gguf_bytes(payload: bytes) -> bytes:
    """A GGUF header (version 3, no tensors, no metadata) and ``payload``: enough for the sniff."""
    return struct.pack("<4sIQQ", b"GGUF", 3, 0, 0) + payload


class FakeConverter:
    """A complete (if tiny) HF folder in a blink instead of a real conversion's ~30 s; its
    config.json names the source's bytes, so a test can tell which file a folder came from."""

    def __init__(self, version: str = "fake-1") -> None:
        self.runs: list[Path] = []
        self.converter = Converter(version, self.run)

    def run(self, gguf: Path, out: Path, progress: bool) -> None:
        self.runs.append(gguf)
        config = {"architectures": ["LlamaForCausalLM"], "source": gguf.read_bytes().hex()}
        (out / "config.json").write_text(json.dumps(config))
        (out / "model.safetensors").write_bytes(b"weights " * 64)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (out / name).write_text("{}")


def _source_of(folder: Path) -> bytes:
    return bytes.fromhex(json.loads((folder / "config.json").read_text())["source"])


def _gguf(path: Path, payload: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gguf_bytes(payload))
    return path


def _entries(cache: Path) -> list[str]:
    """Every converted folder in the cache, as ``key/name``."""
    models = cache / "models"
    return sorted(
        f"{e.name}/{f.name}" for e in models.iterdir() if not e.name.startswith(".") for f in e.iterdir()
    )


@pytest.mark.parametrize(
    ("file_name", "folder"),
    [
        ("...gguf", "model"),
        ("..gguf", "model"),
        ("-.gguf", "model"),
        (".hidden.gguf", "hidden"),
        ("a b;$(rm -rf ~).gguf", "a_b___rm_-rf___"),
        ("ünï.gguf", "_n_"),
        ("ok-1.5B.gguf", "ok-1.5B"),
    ],
)
def test_hostile_gguf_names_convert_into_a_safe_folder_and_delete_nothing(
    tmp_path: Path, file_name: str, folder: str
) -> None:
    cache = tmp_path / "cache"
    (cache / "models").mkdir(parents=True)
    canaries = [cache / "canary", cache / "models" / "canary", tmp_path / "canary"]
    for canary in canaries:
        canary.write_text("still here")
    gguf = _gguf(tmp_path / "in" / file_name, b"weights")
    resolved = ModelStore(cache, FakeConverter().converter).resolve(str(gguf), progress=False)
    assert resolved.name == folder and resolved.parent.parent == cache / "models"
    assert served_model_name(resolved) == folder and _source_of(resolved) == gguf_bytes(b"weights")
    assert all(c.read_text() == "still here" for c in canaries)
    assert sorted(p.name for p in resolved.parent.iterdir()) == [folder]


def test_a_garbage_gguf_is_refused_by_name_and_never_gets_another_files_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The bug: an 11-byte b/foo.gguf "converted" (exit 0) into the folder made from a/foo.gguf."""
    cache = tmp_path / "cache"
    store = ModelStore(cache, FakeConverter().converter)
    real = store.resolve(str(_gguf(tmp_path / "a" / "foo.gguf", b"real weights")), progress=False)
    garbage = tmp_path / "b" / "foo.gguf"
    garbage.parent.mkdir()
    garbage.write_bytes(b"not a model")
    with pytest.raises(ConfigError, match=f"{re.escape(str(garbage))} is not a GGUF file"):
        store.resolve(str(garbage), progress=False)
    assert _entries(cache) == [f"{real.parent.name}/foo"]
    assert convert.main([str(garbage), "--quiet"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and str(garbage) in err and "not a GGUF file" in err


def test_a_file_of_the_same_name_with_other_weights_gets_its_own_folder(tmp_path: Path) -> None:
    fake = FakeConverter()
    store = ModelStore(tmp_path, fake.converter)
    first = store.resolve(str(_gguf(tmp_path / "a" / "foo.gguf", b"one")), progress=False)
    second = store.resolve(str(_gguf(tmp_path / "b" / "foo.gguf", b"two")), progress=False)
    assert first != second and first.name == second.name == "foo"
    assert (_source_of(first), _source_of(second)) == (gguf_bytes(b"one"), gguf_bytes(b"two"))
    _gguf(tmp_path / "a" / "foo.gguf", b"three")  # rewritten in place: the same path, new content
    third = store.resolve(str(tmp_path / "a" / "foo.gguf"), progress=False)
    assert _source_of(third) == gguf_bytes(b"three") and len(fake.runs) == 3


def test_the_same_content_converts_once_and_a_warm_start_hashes_nothing(tmp_path: Path) -> None:
    fake = FakeConverter()
    gguf = _gguf(tmp_path / "m.gguf", b"weights")
    folders = {ModelStore(tmp_path, fake.converter).resolve(str(gguf), progress=False) for _ in range(3)}
    assert len(folders) == 1 and fake.runs == [gguf.resolve()]
    assert SourceDigests(tmp_path / "models" / ".sources").digest(gguf.resolve()).recorded


def test_a_new_converter_version_converts_again(tmp_path: Path) -> None:
    gguf = str(_gguf(tmp_path / "m.gguf", b"weights"))
    old = ModelStore(tmp_path, FakeConverter("fake-1").converter).resolve(gguf, progress=False)
    new = ModelStore(tmp_path, FakeConverter("fake-2").converter).resolve(gguf, progress=False)
    assert old != new and old.parent.name[:32] == new.parent.name[:32]  # same source, other converter


def _truncate_weights(folder: Path) -> None:
    (folder / "model.safetensors").write_bytes(b"weights ")


def _swap_weights_same_size(folder: Path) -> None:
    weights = folder / "model.safetensors"
    weights.write_bytes(b"W" * weights.stat().st_size)


def _add_weights(folder: Path) -> None:
    (folder / "extra.safetensors").write_bytes(b"")


def _drop_manifest(folder: Path) -> None:
    (folder / MANIFEST).unlink()


def _foreign_manifest(folder: Path) -> None:
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["source_sha256"] = "0" * 64
    (folder / MANIFEST).write_text(json.dumps(manifest))


def _folder_is_a_symlink(folder: Path) -> None:
    elsewhere = folder.parent.parent / "elsewhere"
    folder.rename(elsewhere)
    folder.symlink_to(elsewhere)


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (_truncate_weights, "model.safetensors: 8 bytes, expected 512"),
        (_swap_weights_same_size, "model.safetensors: content differs"),
        (_add_weights, "unexpected ['extra.safetensors']"),
        (_drop_manifest, "no readable interlock-manifest.json"),
        (_foreign_manifest, "made from another file"),
        (_folder_is_a_symlink, "a symlink, not a folder"),
    ],
)
def test_a_damaged_entry_is_refused_and_converted_again(
    tmp_path: Path, damage: Callable[[Path], None], problem: str, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeConverter()
    gguf = _gguf(tmp_path / "m.gguf", b"weights")
    store = ModelStore(tmp_path, fake.converter)
    folder = store.resolve(str(gguf), progress=False)
    damage(folder)
    assert problem in (entry_problem(folder, hashlib.sha256(gguf.read_bytes()).hexdigest(), "fake-1") or "")
    assert store.resolve(str(gguf), progress=False) == folder and len(fake.runs) == 2
    assert entry_problem(folder, hashlib.sha256(gguf.read_bytes()).hexdigest(), "fake-1") is None
    assert not folder.is_symlink() and _source_of(folder) == gguf.read_bytes()


def test_a_failed_conversion_is_a_config_error_naming_the_file_and_leaves_nothing(tmp_path: Path) -> None:
    def broken(gguf: Path, out: Path, progress: bool) -> None:
        (out / "half.safetensors").write_bytes(b"half")
        raise ValueError("tensor 'blk.0' runs past the end of the file")

    gguf = _gguf(tmp_path / "m.gguf", b"weights")
    with pytest.raises(ConfigError, match=f"cannot convert {re.escape(str(gguf))}: ValueError: tensor"):
        ModelStore(tmp_path, Converter("broken-1", broken)).resolve(str(gguf), progress=False)
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == [".lock"]


def test_a_header_only_gguf_fails_in_the_real_converter_with_its_name(tmp_path: Path) -> None:
    gguf = _gguf(tmp_path / "empty.gguf", b"")
    with pytest.raises(ConfigError, match=f"cannot convert {re.escape(str(gguf))}"):
        ModelStore(tmp_path).resolve(str(gguf), progress=False)
    assert _entries(tmp_path) == []


def test_the_old_layout_is_ignored_and_left_alone(tmp_path: Path) -> None:
    """Folders named after the file (the previous layout) prove nothing about their source."""
    (tmp_path / "models" / "m").mkdir(parents=True)
    old = _folder(tmp_path / "models" / "m", ["LlamaForCausalLM"])
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (old / name).write_text("{}")
    (tmp_path / "models" / ".m.lock").write_text("")
    gguf = _gguf(tmp_path / "m.gguf", b"weights")
    folder = ModelStore(tmp_path, FakeConverter().converter).resolve(str(gguf), progress=False)
    assert folder != old and _source_of(folder) == gguf.read_bytes()
    assert sorted(p.name for p in old.iterdir()) == sorted(
        ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    )


def test_a_killed_conversions_temp_folders_are_replaced(tmp_path: Path) -> None:
    gguf = _gguf(tmp_path / "m.gguf", b"weights")
    sha = hashlib.sha256(gguf.read_bytes()).hexdigest()
    entry = tmp_path / "models" / entry_key(sha, "fake-1")
    killed = entry / ".m.tmp-abcd1234"  # what mkdtemp made for a conversion that was killed
    (killed / "half-written").mkdir(parents=True)
    other = entry / ".m.tmp-abcd1234.tmp-zzzz9999"  # another name's: never touched
    other.mkdir()
    folder = ModelStore(tmp_path, FakeConverter().converter).resolve(str(gguf), progress=False)
    assert folder == entry / "m" and entry_problem(folder, sha, "fake-1") is None
    assert not killed.exists() and other.is_dir()


def test_a_big_file_is_checked_by_size_header_and_samples(tmp_path: Path) -> None:
    """The trade-off written in cache.py: a changed byte in a sampled chunk is caught, one
    between samples is not (that is the file system's job)."""
    big = tmp_path / "model.safetensors"
    size = WHOLE_MAX + CHUNKS * CHUNK
    big.write_bytes(bytes(size))
    before = sample_sha256(big, size)
    with open(big, "r+b") as fh:
        fh.seek(CHUNK + 1)  # between the first and the second sample
        fh.write(b"x")
    assert sample_sha256(big, size) == before
    with open(big, "r+b") as fh:
        fh.seek(7)  # in the header
        fh.write(b"x")
    assert sample_sha256(big, size) != before


def test_safe_model_name() -> None:
    assert [safe_model_name(s) for s in (".", "..", "", "a/../b", "x" * 300)] == [
        "model",
        "model",
        "model",
        "a_.._b",
        "x" * 128,
    ]


def test_generation_defaults_come_from_the_folder_or_the_known_model(tmp_path: Path) -> None:
    from interlock.model_store import SMOLLM2_NAME, generation_defaults

    folder = tmp_path / "m"
    folder.mkdir()
    assert generation_defaults(folder) == {}
    (folder / "generation_config.json").write_text('{"temperature": 0.7, "top_k": 20, "eos_token_id": 2}')
    assert generation_defaults(folder) == {"temperature": 0.7, "top_k": 20.0}
    (folder / "generation_config.json").write_text('{"do_sample": false, "temperature": 0.7}')
    assert generation_defaults(folder) == {"temperature": 0.0}
    known = tmp_path / SMOLLM2_NAME
    known.mkdir()
    (known / "generation_config.json").write_text('{"eos_token_id": 2}')
    assert generation_defaults(known) == {"temperature": 0.2, "top_p": 0.9}  # its model card's
