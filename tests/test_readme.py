"""README.md's layout list names exactly the packages and top-level modules of ``interlock/``, and
its import-contract sentence matches ``pyproject.toml``: a new package without a README line, or a
README line for one that is gone, fails here."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
PACKAGE = ROOT / "interlock"
ENTRY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.py|/)")


def layout_block() -> str:
    """The first fenced block after the ``## Layout`` heading."""
    section = README.split("\n## Layout\n", 1)
    assert len(section) == 2, "README.md has no '## Layout' section"
    block = re.search(r"```\n(.*?)```", section[1], re.DOTALL)
    assert block, "README.md's Layout section has no fenced block"
    return block.group(1)


def listed() -> list[str]:
    """The names on the list's lines under ``interlock/`` (indented two spaces): the leading
    ``name.py`` / ``name/`` words of each line, before its description."""
    lines = layout_block().splitlines()
    assert lines and lines[0].split()[0] == "interlock/", "the layout block starts with 'interlock/'"
    names = []
    for line in lines[1:]:
        if not line.startswith("  "):
            continue  # outside interlock/ (deploy/k8s/ ...)
        for word in line.split():
            if not ENTRY.fullmatch(word):
                break
            names.append(word)
    return names


def actual() -> set[str]:
    """The package's public packages (``name/`` with an ``__init__.py``) and modules (``name.py``)."""
    found = set()
    for path in PACKAGE.iterdir():
        if path.name.startswith(("_", ".")):
            continue  # __init__.py, __pycache__, private modules
        if path.is_dir() and (path / "__init__.py").exists():
            found.add(f"{path.name}/")
        elif path.is_file() and path.suffix == ".py":
            found.add(path.name)
    return found


def test_the_layout_list_is_found() -> None:
    names = listed()
    assert "cli/" in names and "errors.py" in names
    assert len(names) == len(set(names)), f"listed twice: {sorted({n for n in names if names.count(n) > 1})}"


def test_the_layout_list_names_every_package_and_module() -> None:
    names, present = set(listed()), actual()
    missing, gone = sorted(present - names), sorted(names - present)
    assert not missing, f"in interlock/ but not in README.md's layout list: {missing}"
    assert not gone, f"in README.md's layout list but not in interlock/: {gone}"


def test_the_import_contract_sentence_matches_pyproject() -> None:
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c["layers"] for c in contracts if c["type"] == "layers")
    sentence = re.search(r"every\s+top-level module placed: (.*?)\s*\(a layer", README, re.DOTALL)
    assert sentence, "README.md's sentence on the layered import contract is missing"
    assert " ".join(sentence.group(1).split()) == "; ".join(layers)
