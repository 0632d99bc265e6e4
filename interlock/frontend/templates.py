"""Chat templates: the model's own Jinja template, rendered in a sandbox.

The template comes from the model folder, as Hugging Face stores it: ``chat_template`` in
``tokenizer_config.json`` (a string, or a list of named templates of which "default" is used),
or a separate ``chat_template.jinja`` file (what newer transformers versions write). It is
compiled once per model and rendered with the same variables and Jinja settings transformers
uses (``trim_blocks``, ``lstrip_blocks``, ``raise_exception``, ``strftime_now``), in an immutable
sandbox because templates ship with downloaded models.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from interlock.errors import InvalidRequest


class ChatTemplate:
    def __init__(self, source: str, *, special_tokens: dict[str, str | None]) -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        env.filters["tojson"] = _tojson
        self._template = env.from_string(source)
        self._special_tokens = special_tokens

    def render(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True) -> str:
        """The prompt text. A template error (e.g. roles out of order) is the client's: 400."""
        try:
            return self._template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                tools=None,
                **self._special_tokens,
            )
        except TemplateError as exc:
            raise InvalidRequest(f"chat template error: {exc}", param="messages") from exc


def load_chat_template_source(model_path: Path, tokenizer_config: dict[str, Any]) -> str | None:
    """The template text of a model folder, or None if it has none."""
    template = tokenizer_config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    if isinstance(template, str) and template:
        return template
    jinja_file = model_path / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text()
    json_file = model_path / "chat_template.json"
    if json_file.is_file():
        value = json.loads(json_file.read_text()).get("chat_template")
        return value if isinstance(value, str) else None
    return None


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(value: Any, indent: int | None = None) -> str:
    # transformers' tojson keeps non-ASCII characters as they are
    return json.dumps(value, ensure_ascii=False, indent=indent)
