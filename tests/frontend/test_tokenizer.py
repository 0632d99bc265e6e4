"""Loading a model folder's tokenizer: stop ids, token bytes, cache."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from interlock.errors import ConfigError
from interlock.frontend.tokenizer import LONG_TEXT_CHARS, ModelTokenizer, load_tokenizer


def test_loaded_once_per_folder(smol_path: Path, tok: ModelTokenizer) -> None:
    assert load_tokenizer(smol_path) is tok
    assert load_tokenizer(str(smol_path)) is tok


def test_special_tokens_and_eos(tok: ModelTokenizer) -> None:
    assert tok.eos_token == "<|im_end|>"
    assert tok.eos_token_ids == (tok.tokenizer.token_to_id("<|im_end|>"),)


def test_token_bytes_rebuild_multibyte_text(tok: ModelTokenizer) -> None:
    ids = tok.encode("naïve 日本 😀", add_special_tokens=False)
    assert b"".join(tok.token_bytes(i) for i in ids) == "naïve 日本 😀".encode()
    assert tok.token_bytes(tok.eos_token_ids[0]) == b"<|im_end|>"


def test_long_texts_encode_off_the_loop_to_the_same_ids(tok: ModelTokenizer) -> None:
    text = "Ünïcode and <|im_start|> special tokens, " * (LONG_TEXT_CHARS // 20)
    assert len(text) > LONG_TEXT_CHARS
    for special in (False, True):
        assert asyncio.run(tok.encode_async(text, add_special_tokens=special)) == tok.encode(
            text, add_special_tokens=special
        )


def test_eos_ids_from_generation_config(tmp_path: Path, smol_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_bytes((smol_path / "tokenizer.json").read_bytes())
    config = json.loads((smol_path / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [0, 2]}))
    tok = load_tokenizer(tmp_path)
    assert tok.eos_token_ids == (0, 2)
    assert tok.chat_template is None  # no template in this folder


def test_missing_tokenizer_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="tokenizer.json"):
        ModelTokenizer(tmp_path)
