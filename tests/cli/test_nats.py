"""``interlock nats``: what it refuses, and a real standalone server with a login, TLS and probes."""

from __future__ import annotations

import asyncio
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from interlock.cli.nats import build_parser, resolve
from interlock.errors import AuthError, ConfigError, TransportError
from interlock.runtime import NatsAuth, NatsServer, RuntimeConfig, connect_runtime
from interlock.runtime.nats_permissions import worker_user
from interlock.runtime.nats_server import ServerTLS

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spec(*argv: str):  # type: ignore[no-untyped-def]
    return resolve(build_parser().parse_args(list(argv)))


@pytest.fixture
def password(tmp_path: Path) -> str:
    path = tmp_path / "password"
    path.write_text("a-long-enough-password\n")
    return str(path)


def test_login_from_files(password: str, tmp_path: Path) -> None:
    s = spec("--host", "0.0.0.0", "--user", "u", "--password-file", password, "--monitor-port", "8222")
    assert (s.host, s.port, s.monitor_port, s.tls) == ("0.0.0.0", 4222, 8222, None)
    assert s.auth == NatsAuth(user="u", password="a-long-enough-password")
    (tmp_path / "token").write_text("tok")
    assert spec("--token-file", str(tmp_path / "token")).auth == NatsAuth(token="tok")
    assert spec().auth is None  # loopback, no login: a private server


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (("--host", "0.0.0.0"), "without a login lets anyone"),
        (("--password-file", "PW"), "needs --user"),
        (("--user", "u"), "needs a password"),
        (("--user", "u", "--password-file", "PW", "--token-file", "PW"), "not both"),
        (("--user", "u", "--password-file", "PW", "--allow-anonymous"), "contradicts"),
        (("--tls-cert", "c.pem"), "go together"),
        (("--tls-ca", "ca.pem"), "needs the server's own"),
        (("--port", "0"), "--port must be in 1..65535"),
        (("--user", "u", "--password-file", "/nonexistent/pw"), "cannot read the NATS password file"),
    ],
)
def test_refused_by_name(argv: tuple[str, ...], match: str, password: str) -> None:
    with pytest.raises(ConfigError, match=match):
        spec(*(password if a == "PW" else a for a in argv))


def test_worker_logins_one_per_file(password: str, tmp_path: Path) -> None:
    logins = tmp_path / "workers"
    logins.mkdir()
    (logins / "pf-1").write_text("pw-of-pf-1\n")
    (logins / "dc-1").write_text("pw-of-dc-1\n")
    s = spec("--user", "u", "--password-file", password, "--worker-logins", str(logins))
    assert s.workers == (worker_user("dc-1", "pw-of-dc-1"), worker_user("pf-1", "pw-of-pf-1"))
    assert s.workers[0].user == "worker-dc-1" and s.workers[0].permissions is not None


def test_worker_logins_refused_by_name(password: str, tmp_path: Path) -> None:
    logins = tmp_path / "workers"
    logins.mkdir()
    with pytest.raises(ConfigError, match="no login in it"):
        spec("--user", "u", "--password-file", password, "--worker-logins", str(logins))
    (logins / "not an id").write_text("pw")
    with pytest.raises(ConfigError, match="invalid instance id 'not an id'"):
        spec("--user", "u", "--password-file", password, "--worker-logins", str(logins))
    with pytest.raises(ConfigError, match="not a folder"):
        spec("--user", "u", "--password-file", password, "--worker-logins", str(tmp_path / "nothing"))
    (tmp_path / "token").write_text("tok")
    with pytest.raises(ConfigError, match="needs the full-rights login to be a user"):
        spec("--token-file", str(tmp_path / "token"), "--worker-logins", str(logins))


def test_anonymous_beyond_loopback_only_when_asked() -> None:
    assert spec("--host", "0.0.0.0", "--allow-anonymous").auth is None


def test_tls_files_reach_the_server_config(password: str) -> None:
    s = spec(
        "--user",
        "u",
        "--password-file",
        password,
        "--tls-cert",
        "c.pem",
        "--tls-key",
        "k.pem",
        "--tls-ca",
        "ca.pem",
    )
    assert s.tls == ServerTLS(cert="c.pem", key="k.pem", ca="ca.pem")


def test_a_standalone_server_takes_only_its_logins_and_answers_probes(password: str, tmp_path: Path) -> None:
    port, monitor = free_port(), free_port()
    (tmp_path / "workers").mkdir()
    (tmp_path / "workers" / "w1").write_text("pw-of-w1")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "interlock.cli.main",
            "nats",
            "--port",
            str(port),
            "--user",
            "u",
            "--password-file",
            password,
            "--monitor-port",
            str(monitor),
            "--worker-logins",
            str(tmp_path / "workers"),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith(f"nats at nats://127.0.0.1:{port} (login as 'u' and 1 worker logins"), line
        with urllib.request.urlopen(f"http://127.0.0.1:{monitor}/healthz", timeout=5) as r:
            assert r.status == 200

        async def join(auth: NatsAuth) -> None:
            runtime = await connect_runtime(f"nats://127.0.0.1:{port}", RuntimeConfig(nats_auth=auth))
            await runtime.close()

        asyncio.run(join(NatsAuth(user="u", password="a-long-enough-password")))
        asyncio.run(join(NatsAuth(user="worker-w1", password="pw-of-w1")))
        with pytest.raises(AuthError):
            asyncio.run(join(NatsAuth(user="u", password="wrong")))
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=30)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make certificates")
def test_mutual_tls(tmp_path: Path) -> None:
    """Server TLS with client certificates: a client with the CA and its certificate joins; one
    without a certificate does not."""
    d = tmp_path
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=test-ca",
        "-keyout",
        f"{d}/ca.key",
        "-out",
        f"{d}/ca.pem",
    )
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1"), ("client", "extendedKeyUsage=clientAuth")):
        _openssl(
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-subj",
            f"/CN={name}",
            "-keyout",
            f"{d}/{name}.key",
            "-out",
            f"{d}/{name}.csr",
        )
        (d / f"{name}.ext").write_text(ext + "\n")
        _openssl(
            "x509",
            "-req",
            "-in",
            f"{d}/{name}.csr",
            "-CA",
            f"{d}/ca.pem",
            "-CAkey",
            f"{d}/ca.key",
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            f"{d}/{name}.ext",
            "-out",
            f"{d}/{name}.pem",
        )
    tls = ServerTLS(cert=f"{d}/server.pem", key=f"{d}/server.key", ca=f"{d}/ca.pem")

    async def join(url: str, auth: NatsAuth) -> None:
        runtime = await connect_runtime(url, RuntimeConfig(nats_auth=auth, connect_timeout=1.0))
        await runtime.close()

    with NatsServer(tls=tls) as server:
        asyncio.run(
            join(
                server.url,
                NatsAuth(tls_ca=f"{d}/ca.pem", tls_cert=f"{d}/client.pem", tls_key=f"{d}/client.key"),
            )
        )
        with pytest.raises((AuthError, TransportError)):
            asyncio.run(join(server.url, NatsAuth(tls_ca=f"{d}/ca.pem")))
