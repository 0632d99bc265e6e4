"""Chat templates from the model folder, rendered in a sandbox."""

from __future__ import annotations

from pathlib import Path

import pytest

from interlock.errors import InvalidRequest
from interlock.frontend.templates import ChatTemplate, load_chat_template_source
from interlock.frontend.tokenizer import ModelTokenizer


def test_smollm2_template(tok: ModelTokenizer) -> None:
    assert tok.chat_template is not None
    text = tok.chat_template.render([{"role": "user", "content": "Hi"}])
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert text.startswith("<|im_start|>system\n")  # the template's default system prompt
    no_prompt = tok.chat_template.render([{"role": "user", "content": "Hi"}], add_generation_prompt=False)
    assert not no_prompt.endswith("assistant\n")


def test_source_from_tokenizer_config_beats_file(tmp_path: Path) -> None:
    (tmp_path / "chat_template.jinja").write_text("file")
    assert load_chat_template_source(tmp_path, {"chat_template": "inline"}) == "inline"
    named = [{"name": "tool_use", "template": "t"}, {"name": "default", "template": "d"}]
    assert load_chat_template_source(tmp_path, {"chat_template": named}) == "d"
    assert load_chat_template_source(tmp_path, {}) == "file"
    assert load_chat_template_source(tmp_path / "nowhere", {}) is None


def test_special_tokens_and_raise_exception() -> None:
    source = (
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}"
        "{{ bos_token }}{% for m in messages %}{{ m['content'] | tojson }}{% endfor %}"
    )
    template = ChatTemplate(source, special_tokens={"bos_token": "<s>", "eos_token": "</s>"})
    assert template.render([{"role": "user", "content": "é"}]) == '<s>"é"'
    with pytest.raises(InvalidRequest, match="user first"):
        template.render([{"role": "assistant", "content": "x"}])


def test_sandbox_blocks_attribute_escapes() -> None:
    template = ChatTemplate("{{ messages.__class__.__mro__ }}", special_tokens={})
    with pytest.raises(Exception):  # noqa: B017 - jinja's SecurityError
        template.render([])
