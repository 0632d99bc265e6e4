"""docs/deploy.md and docs/vllm.md: every ``interlock`` command in their shell blocks parses with
the real parser, so a renamed flag fails here rather than on a user's third machine."""

from __future__ import annotations

import importlib
import re
import shlex
from pathlib import Path

import pytest

from interlock.cli.main import SUBCOMMANDS

DOC = Path(__file__).resolve().parents[1] / "docs" / "deploy.md"
VLLM_DOC = DOC.with_name("vllm.md")


def commands(doc: Path = DOC) -> list[list[str]]:
    blocks = re.findall(r"```(?:sh|bash)\n(.*?)```", doc.read_text(), re.DOTALL)
    lines = [line.strip() for block in blocks for line in block.replace("\\\n", " ").splitlines()]
    found = []
    for line in lines:
        argv = shlex.split(line, comments=True)
        if argv and argv[0].endswith("interlock"):
            found.append(argv[1:])
    return found


def test_the_walkthrough_has_its_commands() -> None:
    assert {argv[0] for argv in commands()} >= {"nats", "frontend", "worker"}


def test_the_vllm_page_has_its_commands() -> None:
    assert {argv[0] for argv in commands(VLLM_DOC)} >= {"serve", "worker"}


@pytest.mark.parametrize("argv", commands() + commands(VLLM_DOC), ids=lambda a: " ".join(a[:3]))
def test_each_command_parses(argv: list[str]) -> None:
    module = importlib.import_module(SUBCOMMANDS[argv[0]])
    if argv[:2] == ["worker", "control"]:
        module.build_control_parser().parse_args(argv[2:])
    elif hasattr(module, "build_parser"):
        module.build_parser().parse_args(argv[1:])  # SystemExit(2) names an unknown flag
