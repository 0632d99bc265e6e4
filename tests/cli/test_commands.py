"""The command line: dispatch, help, and config errors that name the problem (no model loaded)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from interlock.cli.main import SUBCOMMANDS, main


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "interlock.cli.main", *args], capture_output=True, text=True, timeout=120
    )


def test_every_subcommand_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    for name in SUBCOMMANDS:
        with pytest.raises(SystemExit) as e:
            main([name, "--help"])
        assert e.value.code == 0, name
        assert "usage:" in capsys.readouterr().out


def test_unknown_command_fails() -> None:
    r = run("frobnicate")
    assert r.returncode == 2 and "unknown command" in r.stderr


def test_bad_deployment_file_names_the_key(tmp_path) -> None:
    f = tmp_path / "cluster.yaml"
    f.write_text("routing:\n  polcy: kv\n")
    r = run("serve", "-f", str(f))
    assert r.returncode == 2
    assert "routing.polcy: unknown key" in r.stderr


def test_worker_needs_a_nats_url() -> None:
    r = run("worker", "--runner", "mock")
    assert r.returncode == 2 and "--nats-url is required" in r.stderr


def test_serve_restart_policy_is_never_or_on_failure() -> None:
    r = run("serve", "--restart-policy", "sometimes")
    assert r.returncode == 2 and "invalid choice: 'sometimes'" in r.stderr
