"""The frontend's flags fill a validated FrontendConfig."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from interlock.errors import ConfigError
from interlock.frontend.auth import OPEN_PATHS
from interlock.frontend.flags import add_frontend_args, frontend_config


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_frontend_args(parser)
    return parser.parse_args(argv)


def test_defaults_are_the_config_defaults() -> None:
    config = frontend_config(parse())
    assert config.auth.api_keys == () and config.auth.open_paths == OPEN_PATHS
    assert config.max_prompt_chars == 1_000_000 and config.max_connections == 4096


def test_keys_from_flags_file_and_environment(tmp_path: Path) -> None:
    key_file = tmp_path / "keys"
    key_file.write_text("# team keys\nfile-key  # a comment\n\nshared\n")
    args = parse(
        "--api-key",
        "a",
        "--api-key",
        "shared",
        "--api-key-file",
        str(key_file),
        "--rate-limit-rpm",
        "10",
        "--open-path",
        "/live",
        "--max-prompt-chars",
        "99",
    )
    config = frontend_config(args, env_api_keys=("env-key",))
    assert config.auth.api_keys == ("a", "shared", "env-key", "file-key")
    assert config.auth.open_paths == ("/live",) and config.auth.requests_per_minute == 10
    assert config.max_prompt_chars == 99


def test_bad_flags_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="API key file"):
        frontend_config(parse("--api-key-file", str(tmp_path / "missing")))
    with pytest.raises(ConfigError, match="per API key"):
        frontend_config(parse("--rate-limit-tpm", "100"))
    with pytest.raises(ConfigError, match="ssl"):
        frontend_config(parse("--ssl-certfile", "cert.pem"))
