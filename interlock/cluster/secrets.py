"""How a local deployment hands its secrets to the processes it starts: in their environment
(``INTERLOCK_CLUSTER_SECRET``, ``INTERLOCK_NATS_*``), never on a command line (``ps`` shows every
argv); only paths of files (credentials, TLS) go in argv.
"""

from __future__ import annotations

import secrets

from interlock.env import CLUSTER_SECRET_VAR, NATS_PASSWORD_VAR, NATS_TOKEN_VAR, NATS_USER_VAR
from interlock.runtime.config import NatsAuth


def new_cluster_secret() -> bytes:
    return secrets.token_urlsafe(32).encode()


def child_env(secret: bytes | None, auth: NatsAuth) -> dict[str, str]:
    """Environment that hands these to a child process (never its argv). Every variable is
    set, empty when unused, so nothing conflicting leaks in from the parent's environment."""
    return {
        CLUSTER_SECRET_VAR: secret.decode() if secret is not None else "",
        NATS_USER_VAR: auth.user or "",
        NATS_PASSWORD_VAR: auth.password or "",
        NATS_TOKEN_VAR: auth.token or "",
    }


def env_auth(files: NatsAuth) -> NatsAuth:
    """The NATS login a child finds in its environment, with the files ``files`` names."""
    from dataclasses import replace

    from interlock.env import get_env

    env = get_env()
    return replace(files, user=env.nats_user, password=env.nats_password, token=env.nats_token)
