"""Who may publish and subscribe to what on NATS: one login per worker, confined to its own subjects.

``interlock serve`` gives its private nats-server one full-rights login (itself, frontends,
operators) and one login per worker. A worker's login may publish only under its own instance
id (announcements, bye, KV events, load reports) and may subscribe only to what a worker reads
(discovery, its own resync subject, request-plane traffic, inboxes). So a compromised or fake
worker cannot announce itself as another instance, forge another worker's load report or KV
events, or read the KV events (prompts as token ids) of anyone. The subscribers check the other
half: a payload that names another instance than its subject is dropped.

For an external nats-server, ``nats_config_users`` writes the same ``authorization`` block an
operator can paste into the server's configuration (``docs/deploy.md``).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field

from interlock.protocol import subjects
from interlock.protocol.kv_sync import REPLICA_ID_PREFIX
from interlock.runtime.config import NatsAuth
from interlock.runtime.naming import check_token
from interlock.runtime.nats_discovery import QUERY, announce_subject, bye_subject

REQUEST_PLANE = "interlock.rp.>"
"""The NATS request plane (``RuntimeConfig.request_plane="nats"``): plane ids are random per
process, so a worker may use the whole prefix. The default TCP request plane carries no traffic
over NATS."""
INBOXES = "_INBOX.>"


@dataclass(frozen=True)
class Permissions:
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]


def worker_permissions(instance_id: str, also: Sequence[str] = ()) -> Permissions:
    """``also``: the ids of the models the worker's process hosts besides its own (each
    announces, publishes and is asked to resync under its own id)."""
    ids = (instance_id, *also)
    for i in ids:
        check_token(i, "instance_id")
        if i.startswith(REPLICA_ID_PREFIX):
            raise ValueError(
                f"a worker's instance_id may not start with {REPLICA_ID_PREFIX!r} (router replicas' ids)"
            )
    return Permissions(
        publish=(
            *(s for i in ids for s in (announce_subject(i), bye_subject(i))),
            QUERY,
            *(s for i in ids for s in (subjects.kv(i), subjects.load(i))),
            REQUEST_PLANE,
            INBOXES,
        ),
        subscribe=(
            announce_subject("*"),
            bye_subject("*"),
            QUERY,
            *(subjects.resync(i) for i in ids),
            REQUEST_PLANE,
            INBOXES,
        ),
    )


@dataclass(frozen=True)
class NatsUser:
    """One login of a nats-server; ``permissions`` None means everything."""

    user: str
    password: str = field(repr=False)
    permissions: Permissions | None = None

    @property
    def auth(self) -> NatsAuth:
        return NatsAuth(user=self.user, password=self.password)


def worker_user(instance_id: str, password: str | None = None, also: Sequence[str] = ()) -> NatsUser:
    """One worker's login, ``worker-<instance id>``, confined to its subjects (and those of the
    models it hosts, ``also``); the password given (``interlock nats --worker-logins``) or a
    fresh one (256 random bits)."""
    secret = password if password is not None else secrets.token_urlsafe(32)
    return NatsUser(f"worker-{instance_id}", secret, worker_permissions(instance_id, also))


def nats_config_users(users: list[NatsUser]) -> str:
    """The ``authorization { users = [...] }`` block of a nats-server configuration."""
    lines = ["authorization {", "  users = ["]
    for u in users:
        entry = f"    {{user: {json.dumps(u.user)}, password: {json.dumps(u.password)}"
        if u.permissions is not None:
            entry += (
                f", permissions: {{publish: {{allow: {json.dumps(list(u.permissions.publish))}}}, "
                f"subscribe: {{allow: {json.dumps(list(u.permissions.subscribe))}}}}}"
            )
        lines.append(entry + "}")
    lines += ["  ]", "}", ""]
    return "\n".join(lines)
