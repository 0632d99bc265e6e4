"""How every command's parser behaves: defaults shown in ``--help``, help text without the
docstrings' markup, and every flag also read from an ``INTERLOCK_<FLAG>`` environment variable
(``--max-num-seqs`` from ``INTERLOCK_MAX_NUM_SEQS``; a flag on the command line wins).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from interlock.cluster.logs import LOG_FORMATS
from interlock.env import flag_environment, get_env
from interlock.errors import ConfigError

Flags = argparse._ActionsContainer
"""Where a group of flags goes: a parser or one of its argument groups (both have ``add_argument``)."""

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults after each help line (not for flags whose default is None or False), the
    description as written, and no ``literal`` markup."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = (action.help or "").replace("``", "")
        if action.default in (None, False, [], argparse.SUPPRESS) or "%(default)" in text:
            return text
        return text + " (default: %(default)s)"

    def _format_text(self, text: str) -> str:
        return super()._format_text(text.replace("``", ""))


def parser(prog: str, description: str) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(prog=prog, description=description, formatter_class=HelpFormatter)


def add_log_level_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--log-level", type=str.upper, default=get_env().log_level, help="DEBUG, INFO, WARNING or ERROR"
    )
    p.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=get_env().log_format,
        help="text, or json: one object per line with a UTC timestamp (serve's workers follow)",
    )


def add_tracing_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tracing",
        action="store_true",
        help="OpenTelemetry traces of each request (needs opentelemetry-sdk): to the OTLP collector "
        "at OTEL_EXPORTER_OTLP_ENDPOINT (needs opentelemetry-exporter-otlp), else as JSON on stderr "
        "(docs/design.md)",
    )


def run_checked(prog: str, run: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """``run(args)``, a ConfigError reported as ``prog: message`` on stderr with exit status 2."""
    try:
        return run(args)
    except ConfigError as e:
        print(f"{prog}: {e.message}", file=sys.stderr)
        return 2


def env_var(action: argparse.Action) -> str:
    return "INTERLOCK_" + action.dest.upper()


def apply_environment(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Set each flag's default from its ``INTERLOCK_*`` variable, when set (read once)."""
    env = flag_environment()
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                apply_environment(sub)
            continue
        if not action.option_strings or action.dest in ("help", "version"):
            continue
        raw = env.get(env_var(action))
        if raw is None:
            continue
        action.default = _convert(action, raw)
        action.required = False
    return p


def _convert(action: argparse.Action, raw: str) -> Any:
    name = env_var(action)
    if action.nargs == 0:  # store_true / store_false / --x/--no-x
        low = raw.strip().lower()
        if low not in _TRUE + _FALSE:
            raise ConfigError(f"{name}: expected true or false, got {raw!r}")
        return low in _TRUE
    if isinstance(action, argparse._AppendAction):
        return [_one(action, v.strip(), name) for v in raw.split(",") if v.strip()]
    return _one(action, raw, name)


def _one(action: argparse.Action, raw: str, name: str) -> Any:
    try:
        value = action.type(raw) if callable(action.type) else raw
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: {raw!r} is not a valid {action.metavar or action.dest}") from None
    if action.choices is not None and value not in action.choices:
        raise ConfigError(f"{name}: {raw!r} is not one of {', '.join(map(str, action.choices))}")
    return value
