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


def test_fairness_and_memory_flags_fill_the_config() -> None:
    defaults = frontend_config(parse())
    assert (defaults.max_client_connections, defaults.reserved_connections, defaults.max_client_requests) == (
        1024,
        8,
        1024,
    )
    assert (defaults.min_body_rate, defaults.body_grace_s, defaults.max_header_chars) == (1024, 5.0, 256)
    assert (defaults.max_stream_buffer_bytes, defaults.stream_stall_timeout_s) == (256 * 1024, 30.0)
    config = frontend_config(
        parse(
            *("--max-client-connections", "7", "--reserved-connections", "0", "--max-client-requests", "3"),
            *("--min-body-rate", "0", "--body-grace", "1.5", "--max-header-chars", "64"),
            *("--max-stream-buffer", "65536", "--stream-stall-timeout", "4"),
        )
    )
    assert (config.max_client_connections, config.reserved_connections, config.max_client_requests) == (
        7,
        0,
        3,
    )
    assert (config.min_body_rate, config.body_grace_s, config.max_header_chars) == (0, 1.5, 64)
    assert (config.max_stream_buffer_bytes, config.stream_stall_timeout_s) == (65536, 4.0)


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--max-client-connections", "0", "max_client_connections"),
        ("--max-client-requests", "0", "max_client_requests"),
        ("--reserved-connections", "-1", "reserved_connections"),
        ("--min-body-rate", "-1", "min_body_rate"),
        ("--body-grace", "0", "body_grace_s"),
        ("--body-grace", "inf", "body_grace_s"),
        ("--max-header-chars", "0", "max_header_chars"),
        ("--max-stream-buffer", "1024", "max_stream_buffer_bytes"),
        ("--stream-stall-timeout", "nan", "stream_stall_timeout_s"),
    ],
)
def test_bad_fairness_and_memory_values_are_config_errors(flag: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        frontend_config(parse(flag, value))
