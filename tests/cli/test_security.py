"""The authenticated planes' flags: secrets from files or the environment, never from argv."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from interlock.cli.security import add_security_args, cluster_secret, nats_auth
from interlock.cluster.secrets import child_env
from interlock.cluster.worker import files_only
from interlock.errors import ConfigError
from interlock.runtime import NatsAuth


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_security_args(p)
    return p.parse_args(argv)


def test_secrets_come_from_files(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("a-cluster-secret-of-enough-length\n")
    (tmp_path / "password").write_text("pw\n")
    a = parse(
        "--cluster-secret-file",
        str(tmp_path / "secret"),
        "--nats-user",
        "u",
        "--nats-password-file",
        str(tmp_path / "password"),
        "--nats-tls-ca",
        "ca.pem",
    )
    assert cluster_secret(a) == b"a-cluster-secret-of-enough-length"
    assert nats_auth(a) == NatsAuth(user="u", password="pw", tls_ca="ca.pem")
    (tmp_path / "token").write_text("tok")
    assert nats_auth(parse("--nats-token-file", str(tmp_path / "token"))) == NatsAuth(token="tok")
    assert nats_auth(parse("--nats-creds", "x.creds")) == NatsAuth(creds_file="x.creds")


def test_missing_or_empty_files_are_config_errors(tmp_path: Path) -> None:
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="empty"):
        cluster_secret(parse("--cluster-secret-file", str(tmp_path / "empty")))
    with pytest.raises(ConfigError, match="cannot read"):
        nats_auth(parse("--nats-token-file", str(tmp_path / "nope")))


def test_children_get_secrets_in_their_environment_and_only_paths_in_argv() -> None:
    auth = NatsAuth(user="interlock", password="pw", tls_ca="/ca.pem")
    assert child_env(b"secret", auth) == {
        "INTERLOCK_CLUSTER_SECRET": "secret",
        "INTERLOCK_NATS_USER": "interlock",
        "INTERLOCK_NATS_PASSWORD": "pw",
        "INTERLOCK_NATS_TOKEN": "",
    }
    assert files_only(auth) == NatsAuth(tls_ca="/ca.pem")  # what a worker's launch spec carries
    assert child_env(None, NatsAuth())["INTERLOCK_CLUSTER_SECRET"] == ""
