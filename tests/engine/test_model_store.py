"""model_store: names, GGUF files and HF folders resolve to a validated local folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from interlock.cli import convert
from interlock.errors import ConfigError
from interlock.model_store import DEFAULT_MODEL, ModelStore, resolve_model, safe_model_name, served_model_name


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


def fake_convert(gguf: Path, out: Path, progress: bool) -> None:
    """A complete (if empty) HF folder, in a blink instead of a real conversion's ~30 s."""
    _folder(out, ["LlamaForCausalLM"])
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (out / name).write_text("{}")


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
    gguf = tmp_path / "in" / file_name
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF")
    store = ModelStore(cache, convert=fake_convert)
    resolved = store.resolve(str(gguf), progress=False)
    assert resolved == cache / "models" / folder and (resolved / "config.json").is_file()
    assert all(c.read_text() == "still here" for c in canaries)
    assert sorted(p.name for p in (cache / "models").iterdir() if not p.name.endswith(".lock")) == sorted(
        ["canary", folder]
    )


def test_an_incomplete_folder_and_a_killed_conversions_temp_folders_are_replaced(tmp_path: Path) -> None:
    models = tmp_path / "models"
    (models / "m").mkdir(parents=True)
    (models / "m" / "half-written").write_text("")
    killed = models / ".m.tmp-abcd1234"  # what mkdtemp made for a conversion that was killed
    killed.mkdir()
    other = models / ".m.tmp-abcd1234.tmp-zzzz9999"  # another name's: never touched
    other.mkdir()
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    folder = ModelStore(tmp_path, convert=fake_convert).resolve(str(gguf), progress=False)
    assert folder == models / "m" and not (folder / "half-written").exists()
    assert not killed.exists() and other.is_dir()


def test_safe_model_name() -> None:
    assert [safe_model_name(s) for s in (".", "..", "", "a/../b", "x" * 300)] == [
        "model",
        "model",
        "model",
        "a_.._b",
        "x" * 128,
    ]
