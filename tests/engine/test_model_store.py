"""model_store: names, GGUF files and HF folders resolve to a validated local folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from interlock.cli import convert
from interlock.errors import ConfigError
from interlock.model_store import DEFAULT_MODEL, resolve_model, served_model_name


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
