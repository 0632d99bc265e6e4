"""Flags for the authenticated planes, shared by ``serve``, ``worker`` and ``frontend``.

Secrets never go on a command line (``ps`` shows every argv): they come from files named by a
flag, or from the environment (``INTERLOCK_CLUSTER_SECRET``, ``INTERLOCK_NATS_USER`` /
``INTERLOCK_NATS_PASSWORD``, ``INTERLOCK_NATS_TOKEN``), which is how ``serve`` hands the ones it
generated to its workers. A flag wins over the environment.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from interlock.env import get_env
from interlock.errors import ConfigError
from interlock.runtime.config import NatsAuth


def add_security_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("authenticated planes")
    g.add_argument(
        "--cluster-secret-file",
        default=None,
        help="file holding the deployment's shared secret (else INTERLOCK_CLUSTER_SECRET): "
        "request-plane and KV-transfer peers must prove they know it",
    )
    g.add_argument(
        "--nats-user",
        default=None,
        help="NATS user (password from --nats-password-file or INTERLOCK_NATS_PASSWORD)",
    )
    g.add_argument("--nats-password-file", default=None, help="file holding the NATS password")
    g.add_argument(
        "--nats-token-file", default=None, help="file holding a NATS token (else INTERLOCK_NATS_TOKEN)"
    )
    g.add_argument("--nats-creds", default=None, help="NATS .creds file (JWT + NKey seed)")
    g.add_argument(
        "--nats-tls-ca", default=None, help="CA bundle for the NATS server's certificate (turns TLS on)"
    )
    g.add_argument("--nats-tls-cert", default=None, help="client certificate for NATS (PEM)")
    g.add_argument("--nats-tls-key", default=None, help="client key for NATS (PEM)")


def read_secret(path: str, what: str) -> str:
    try:
        text = Path(path).read_text().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read the {what} file {path}: {exc.strerror}") from None
    if not text:
        raise ConfigError(f"the {what} file {path} is empty")
    return text


def cluster_secret(a: argparse.Namespace) -> bytes | None:
    if a.cluster_secret_file:
        return read_secret(a.cluster_secret_file, "cluster secret").encode()
    return get_env().cluster_secret


def nats_auth(a: argparse.Namespace) -> NatsAuth:
    """Login and TLS from the flags; the login from the environment when no flag gives one."""
    env = get_env()
    user, password, token = env.nats_user, env.nats_password, env.nats_token
    if a.nats_user or a.nats_password_file or a.nats_token_file or a.nats_creds:
        user = a.nats_user
        password = (
            read_secret(a.nats_password_file, "NATS password")
            if a.nats_password_file
            else (env.nats_password if a.nats_user else None)
        )
        token = read_secret(a.nats_token_file, "NATS token") if a.nats_token_file else None
    return NatsAuth(
        user=user,
        password=password,
        token=token,
        creds_file=a.nats_creds,
        tls_ca=a.nats_tls_ca,
        tls_cert=a.nats_tls_cert,
        tls_key=a.nats_tls_key,
    )
