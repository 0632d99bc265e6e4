"""Chat templates: the model's own Jinja template, rendered in a sandbox.

The template comes from the model folder, as Hugging Face stores it: ``chat_template`` in
``tokenizer_config.json`` (a string, or a list of named templates of which "default" is used),
or a separate ``chat_template.jinja`` file (what newer transformers versions write). It is
compiled once per model and rendered with the same variables and Jinja settings transformers
uses (``trim_blocks``, ``lstrip_blocks``, ``raise_exception``, ``strftime_now``), in an immutable
sandbox because templates ship with downloaded models.

A message's ``name`` goes to the template; a template that does not render names (SmolLM2's)
gets it at the head of the message's text (``"name: text"``), so the model still tells two
participants of one role apart rather than the field being dropped.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

from jinja2 import TemplateError, meta
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
        self.source = source
        self._special_tokens = special_tokens
        self.variables = frozenset(meta.find_undeclared_variables(env.parse(source)))
        """The variables the template reads (``chat_template_kwargs`` may set only these)."""
        self.uses_names = _NAME_USE.search(source) is not None
        """Whether the template renders a message's ``name``."""

    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        extra: dict[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """The prompt text. A template error (e.g. roles out of order) is the client's: 400.

        ``continue_final_message`` (vLLM's): the last (assistant) message is left open, so the
        model continues it: the text is cut right after that message's content. ``extra``: the
        client's ``chat_template_kwargs``, extra variables for the template; they cannot replace
        the ones the server sets."""
        extra = dict(extra or {})
        clash = sorted(set(extra) & {"messages", "add_generation_prompt", "tools", *self._special_tokens})
        if clash:
            raise InvalidRequest(
                f"chat_template_kwargs cannot set {', '.join(clash)}", param="chat_template_kwargs"
            )
        unused = sorted(set(extra) - self.variables)
        if unused:
            raise InvalidRequest(
                f"chat_template_kwargs: this model's chat template does not use {', '.join(unused)}",
                param="chat_template_kwargs",
            )
        if not self.uses_names:  # a participant's name still reaches the model, in the text
            messages = [_named(m) for m in messages]
        try:
            text: str = self._template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                tools=tools,
                **self._special_tokens,
                **extra,
            )
        except TemplateError as exc:
            raise InvalidRequest(f"chat template error: {exc}", param="messages") from exc
        if continue_final_message:
            final = str(messages[-1].get("content") or "")
            if not final:
                raise InvalidRequest(
                    "continue_final_message needs text in the final message", param="continue_final_message"
                )
            cut = text.rfind(final)
            if cut < 0:
                raise InvalidRequest(
                    "continue_final_message: the chat template does not keep the final message's "
                    "text as it is",
                    param="continue_final_message",
                )
            text = text[: cut + len(final)]
        return text


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


_NAME_USE = re.compile(r"""message(\.name\b|\[\s*['"]name['"]\s*\])""")


def _named(message: dict[str, Any]) -> dict[str, Any]:
    name = message.get("name")
    if not name:
        return message
    return {**message, "content": f"{name}: {message.get('content') or ''}"}


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(value: Any, indent: int | None = None) -> str:
    # transformers' tojson keeps non-ASCII characters as they are
    return json.dumps(value, ensure_ascii=False, indent=indent)
