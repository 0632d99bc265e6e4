"""Three machines on this one, joined as docs/deploy.md says (network namespaces on a bridge).

- ``control`` (198.18.0.1): ``interlock nats`` with a login, and ``interlock frontend``, and a
  second ``interlock frontend --kv-index remote`` that keeps no KV index and asks the first;
- ``prefill`` (198.18.0.2): ``interlock worker --role prefill`` (real SmolLM2);
- ``decode`` (198.18.0.3): ``interlock worker --role decode``;
- ``client`` (198.18.0.4): the official ``openai`` client.

Every process gets its NATS login and the cluster secret from files: the frontend the
full-rights login, each worker its own, confined to its subjects (``interlock nats
--worker-logins``); workers bind every interface and advertise their host's address; each worker host has a /dev/shm of its own, so KV
can only cross between hosts over TCP. Everything runs in namespaces this test makes and removes;
no address is added to this machine's own network (``tests/e2e/netns.py``).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e import netns

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
NATS_PORT, FRONTEND_PORT, KV_PORT = 4222, 8000, 5557
"""The ports docs/deploy.md opens."""
REMOTE_PORT = 8001
"""The frontend without a KV index of its own."""
LEASES = ("--heartbeat-interval", "0.25", "--heartbeat-timeout", "2.0")
DRAIN = ("--drain-grace", "2")
ENGINE = (
    "--model",
    "smollm2",
    "--threads",
    "1",
    "--num-blocks",
    "256",
    "--max-model-len",
    "1024",
    "--dtype",
    "float32",
)
"""fp32: tests compare greedy texts across prefix-cache states (a second request reuses the
first's KV), where bf16 can flip a near-tie on CPUs whose bf16 kernels round differently by
shape (seen on an Intel Xeon with AMX); fp32 does not."""
MODEL = "SmolLM2-135M-Instruct"
"""The name the workers serve SmolLM2 under."""
START_TIMEOUT_S = 400.0
"""Two workers load SmolLM2 at once on a shared 2-core machine."""


@dataclass
class Proc:
    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, line: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while line not in self.text():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{self.name} never printed {line!r}:\n{self.text()[-4000:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


@dataclass
class Deployment:
    hosts: dict[str, netns.Host]
    procs: dict[str, Proc]
    login: tuple[str, ...]

    def base_url(self, port: int = FRONTEND_PORT) -> str:
        return f"http://{self.hosts['control'].address}:{port}"

    def get(self, path: str, port: int = FRONTEND_PORT) -> str:
        """GET from a frontend, as the client machine."""

        def fetch() -> str:
            no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            with no_proxy.open(self.base_url(port) + path, timeout=10) as r:
                return str(r.read().decode())

        return self.hosts["client"].call(fetch)

    def status(self, worker: str) -> dict[str, object]:
        """``interlock worker control status`` run on the control host (NATS there, the call to
        the worker's advertised address across hosts)."""
        argv = self.hosts["control"].argv(
            sys.executable,
            "-m",
            "interlock.cli.main",
            "worker",
            "control",
            "status",
            "--instance-id",
            worker,
            *self.login,
        )
        r = subprocess.run(argv, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        reply: dict[str, object] = json.loads(r.stdout)
        return reply

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.text()[-3000:]}" for p in self.procs.values())


def _env() -> dict[str, str]:
    drop = (
        "INTERLOCK_NATS_URL",
        "INTERLOCK_NATS_USER",
        "INTERLOCK_NATS_PASSWORD",
        "INTERLOCK_NATS_TOKEN",
        "INTERLOCK_CLUSTER_SECRET",
    )
    env = {k: v for k, v in os.environ.items() if k not in drop}
    return {**env, "HF_HUB_OFFLINE": "1", "INTERLOCK_LOG_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1"}


def _secret_file(path: Path) -> str:
    path.write_text(secrets.token_urlsafe(32) + "\n")
    path.chmod(0o600)
    return str(path)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    why = netns.unavailable()
    if why is not None:
        pytest.skip(f"multi-host test: {why}")
    d = tmp_path_factory.mktemp("multihost")
    password, secret = _secret_file(d / "nats-password"), _secret_file(d / "cluster-secret")
    (d / "worker-logins").mkdir()
    for role in ("prefill", "decode"):  # each worker's instance id is its role here
        _secret_file(d / "worker-logins" / role)
    procs: dict[str, Proc] = {}

    def start(name: str, host: netns.Host, *args: str, private_shm: bool = False) -> Proc:
        log = d / f"{name}.log"
        with log.open("wb") as out:
            argv = host.argv(sys.executable, "-m", "interlock.cli.main", *args, private_shm=private_shm)
            process = subprocess.Popen(
                argv, cwd=ROOT, env=_env(), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
            )
        procs[name] = Proc(name, process, log)
        return procs[name]

    with netns.hosts(("control", "prefill", "decode", "client")) as h:
        try:
            start(
                "nats",
                h["control"],
                "nats",
                "--host",
                "0.0.0.0",
                "--port",
                str(NATS_PORT),
                "--user",
                "interlock",
                "--password-file",
                password,
                "--worker-logins",
                str(d / "worker-logins"),
            ).wait_for("nats at", 30)
            url = (
                "--nats-url",
                f"nats://{h['control'].address}:{NATS_PORT}",
                "--cluster-secret-file",
                secret,
            )
            login = (*url, "--nats-user", "interlock", "--nats-password-file", password)
            for role in ("prefill", "decode"):
                own = (
                    "--nats-user",
                    f"worker-{role}",
                    "--nats-password-file",
                    str(d / "worker-logins" / role),
                )
                start(
                    role,
                    h[role],
                    "worker",
                    "--role",
                    role,
                    "--instance-id",
                    role,
                    "--host",
                    "0.0.0.0",
                    "--advertise-host",
                    h[role].address,
                    "--kv-transfer-port",
                    str(KV_PORT),
                    *url,
                    *own,
                    *LEASES,
                    *DRAIN,
                    *ENGINE,
                    private_shm=True,
                )
            start(
                "frontend",
                h["control"],
                "frontend",
                "--host",
                "0.0.0.0",
                "--port",
                str(FRONTEND_PORT),
                *login,
                *LEASES,
                "--enforce-disagg",
            ).wait_for("frontend at", 120)
            start(
                "frontend-remote",
                h["control"],
                "frontend",
                "--host",
                "0.0.0.0",
                "--port",
                str(REMOTE_PORT),
                *login,
                *LEASES,
                "--enforce-disagg",
                "--kv-index",
                "remote",
            ).wait_for("frontend at", 120)
            dep = Deployment(h, procs, login)
            _wait_for_workers(dep, ("prefill", "decode"))
            yield dep
        finally:
            for p in reversed(procs.values()):
                p.stop()


def _wait_for_workers(dep: Deployment, workers: tuple[str, ...]) -> None:
    """Until the frontend has a load report from each worker (they joined and it sees them)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        for p in dep.procs.values():
            assert p.process.poll() is None, f"{p.name} exited:\n{dep.logs()}"
        try:
            metrics = dep.get("/metrics")
        except (OSError, urllib.error.URLError):
            metrics = ""
        if all(f'interlock_worker_kv_blocks_capacity{{worker="{w}"' in metrics for w in workers):
            return
        time.sleep(1.0)
    raise AssertionError(f"workers {workers} did not join within {START_TIMEOUT_S} s:\n{dep.logs()}")


def _client(dep: Deployment, port: int = FRONTEND_PORT):  # type: ignore[no-untyped-def]
    import httpx
    import openai

    return openai.OpenAI(
        base_url=dep.base_url(port) + "/v1",
        api_key="unused",
        max_retries=0,
        http_client=httpx.Client(trust_env=False, timeout=120),
    )  # no proxy from the env


def test_chat_completions_through_a_frontend_on_another_host(deployment: Deployment) -> None:
    def chat() -> tuple[list[str], str, str]:
        client = _client(deployment)
        models = [m.id for m in client.models.list().data]
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        whole = client.chat.completions.create(
            model=MODEL,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=12,
            temperature=0.0,
        )
        stream = client.chat.completions.create(
            model=MODEL,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=12,
            temperature=0.0,
            stream=True,
        )
        streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert whole.usage is not None and whole.usage.completion_tokens > 0
        return models, whole.choices[0].message.content or "", streamed

    models, text, streamed = deployment.hosts["client"].call(chat)
    assert models == [MODEL]
    assert text.strip() and streamed.strip()
    # Both workers answer a control call at the address they advertise, from the control host.
    for worker in ("prefill", "decode"):
        reply = deployment.status(worker)
        assert reply["ok"] and reply["role"] == worker, reply


def test_a_disaggregated_request_moves_its_kv_between_hosts_over_tcp(deployment: Deployment) -> None:
    before = deployment.status("decode")["pulls_by_transport"]
    enforced = _enforced(deployment.get("/metrics"))
    assert isinstance(before, dict)
    prompt = "Tell me about Paris. " * 20  # several KV blocks

    def chat() -> str:
        out = _client(deployment).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=8, temperature=0.0
        )
        return out.choices[0].message.content or ""

    assert deployment.hosts["client"].call(chat).strip()
    after = deployment.status("decode")["pulls_by_transport"]
    assert isinstance(after, dict)
    assert after.get("tcp", 0) == before.get("tcp", 0) + 1, (before, after)
    assert set(after) == {"tcp"}, after  # never shared memory or in-process between hosts
    assert _enforced(deployment.get("/metrics")) == enforced + 1


def _enforced(metrics: str) -> int:
    """Remote prefills the frontend's router chose because disaggregation is enforced."""
    key = 'interlock_disagg_choices_total{reason="enforced"} '
    return sum(int(line[len(key) :]) for line in metrics.splitlines() if line.startswith(key))


def test_a_frontend_without_an_index_serves_the_openai_client_by_the_first_one_s_lookups(
    deployment: Deployment,
) -> None:
    """``--kv-index remote``: no KV event reaches it; each request asks the first frontend which
    worker holds its prefix, and answers as the first does (greedy)."""
    prompt = "Tell me about Lyon. " * 20

    def chat(port: int) -> tuple[str, str]:
        raw = _client(deployment, port).chat.completions.with_raw_response.create(
            model=MODEL,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=8,
            temperature=0.0,
            extra_headers={"x-interlock-explain": "1"},
        )
        return raw.parse().choices[0].message.content or "", raw.headers.get("x-interlock-route", "")

    local_text, _ = deployment.hosts["client"].call(lambda: chat(FRONTEND_PORT))
    remote_text, route = deployment.hosts["client"].call(lambda: chat(REMOTE_PORT))
    assert remote_text == local_text and remote_text.strip()
    assert route.startswith("worker=decode"), route
    metrics = deployment.get("/metrics", REMOTE_PORT)
    assert 'interlock_router_kv_lookups_total{outcome="answered"} 1' in metrics, metrics[-2000:]
    assert 'interlock_router_kv_lookups_total{outcome="failed"} 0' in metrics
    assert "interlock_router_kv_lookups_served_total 1" in deployment.get("/metrics")
