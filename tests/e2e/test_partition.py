"""A network partition between one worker and the NATS server (namespaces + ``tc``).

Five machines on this one (``tests/e2e/netns.py``): ``nats`` (``interlock nats``), ``control``
(``interlock frontend``), workers ``w1`` and ``w2`` (mock runner), and ``client``. For 12 s w1
and the NATS host cannot reach each other (a blackhole route on each side: this kernel has no
``netem`` to drop packets with, and routes need no module): w1 can no longer heartbeat, but the
frontend still reaches it on its request plane. With 2 s leases, the old code dropped w1 two seconds in; now the frontend keeps
routing to it (its lease is vouched for by a ping), no request fails, ``/health`` names it, and
after the partition heals it is heard from again and the note goes away.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e import netns
from tests.e2e.test_multihost import (
    MODEL,
    NATS_PORT,
    Deployment,
    Proc,
    _client,
    _env,
    _secret_file,
    _wait_for_workers,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
FRONTEND_PORT = 8000
LEASES = ("--heartbeat-interval", "0.25", "--heartbeat-timeout", "2.0")
MOCK = ("--runner", "mock", "--max-model-len", "1024", "--num-blocks", "256")
PARTITION_S = 12.0
WORKERS = ("w1", "w2")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    why = netns.unavailable()
    if why is not None:
        pytest.skip(f"partition test: {why}")
    d = tmp_path_factory.mktemp("partition")
    password, secret = _secret_file(d / "nats-password"), _secret_file(d / "cluster-secret")
    (d / "worker-logins").mkdir()
    for wid in WORKERS:
        _secret_file(d / "worker-logins" / wid)
    procs: dict[str, Proc] = {}

    def start(name: str, host: netns.Host, *args: str) -> Proc:
        log = d / f"{name}.log"
        with log.open("wb") as out:
            argv = host.argv(sys.executable, "-m", "interlock.cli.main", *args)
            process = subprocess.Popen(
                argv, cwd=ROOT, env=_env(), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
            )
        procs[name] = Proc(name, process, log)
        return procs[name]

    with netns.hosts(("nats", "control", "w1", "w2", "client")) as h:
        try:
            start(
                "nats", h["nats"], "nats", "--host", "0.0.0.0", "--port", str(NATS_PORT),
                "--user", "interlock", "--password-file", password,
                "--worker-logins", str(d / "worker-logins"),
            ).wait_for("nats at", 30)  # fmt: skip
            url = (
                "--nats-url",
                f"nats://{h['nats'].address}:{NATS_PORT}",
                "--cluster-secret-file",
                secret,
            )
            login = (*url, "--nats-user", "interlock", "--nats-password-file", password)
            for wid in WORKERS:
                own = ("--nats-user", f"worker-{wid}", "--nats-password-file", str(d / "worker-logins" / wid))
                start(
                    wid, h[wid], "worker", "--instance-id", wid, "--host", "0.0.0.0",
                    "--advertise-host", h[wid].address, *url, *own, *LEASES, *MOCK,
                )  # fmt: skip
            start(
                "frontend", h["control"], "frontend", "--host", "0.0.0.0", "--port", str(FRONTEND_PORT),
                *login, *LEASES,
            ).wait_for("frontend at", 120)  # fmt: skip
            dep = Deployment(h, procs, login)
            _wait_for_workers(dep, WORKERS)
            yield dep
        finally:
            for p in reversed(procs.values()):
                p.stop()


def route(host: netns.Host, *args: str) -> None:
    subprocess.run(["ip", "-n", host.netns, "route", *args], check=True, capture_output=True, timeout=20)


def partition(a: netns.Host, b: netns.Host) -> None:
    """Nothing ``a`` sends reaches ``b`` and the other way round (everyone else unaffected)."""
    route(a, "add", "blackhole", f"{b.address}/32")
    route(b, "add", "blackhole", f"{a.address}/32")


def heal(a: netns.Host, b: netns.Host) -> None:
    route(a, "del", "blackhole", f"{b.address}/32")
    route(b, "del", "blackhole", f"{a.address}/32")


def test_a_worker_cut_off_from_nats_keeps_serving_through_the_frontend(deployment: Deployment) -> None:
    dep = deployment
    import json

    def health() -> dict[str, object]:
        body: dict[str, object] = json.loads(dep.get("/health"))
        return body

    results: list[str] = []
    pinned: list[str] = []
    stop = threading.Event()

    def load() -> None:
        client = _client(dep)
        i = 0
        while not stop.is_set():
            try:
                r = client.completions.create(
                    model=MODEL, prompt=f"partition {i}", max_tokens=8, temperature=0
                )
                results.append("ok" if r.choices[0].text is not None else "empty")
            except Exception as exc:  # noqa: BLE001 - counted and asserted below
                results.append(f"{type(exc).__name__}: {exc}")
            i += 1

    def pin_w1() -> str:
        r = _client(dep).completions.with_raw_response.create(
            model=MODEL, prompt="pinned", max_tokens=4, extra_headers={"x-worker-id": "w1"}
        )
        return str(r.http_response.status_code)

    loader = threading.Thread(target=lambda: dep.hosts["client"].call(load, timeout_s=120))
    loader.start()
    time.sleep(2.0)
    partition(dep.hosts["w1"], dep.hosts["nats"])
    cut_at = time.monotonic()
    seen_vouched = False
    try:
        while time.monotonic() - cut_at < PARTITION_S:
            body = health()
            assert body["status"] in ("ok", "degraded"), body
            seen_vouched |= body.get("vouched_workers") == ["w1"]
            pinned.append(dep.hosts["client"].call(pin_w1))
            time.sleep(0.5)
    finally:
        heal(dep.hosts["w1"], dep.hosts["nats"])
    healed_at = time.monotonic()
    while health().get("vouched_workers"):
        assert time.monotonic() - healed_at < 30, health()
        time.sleep(0.5)
    back_s = time.monotonic() - healed_at
    stop.set()
    loader.join(60)
    failed = [r for r in results if r != "ok"]
    print(
        f"{len(results)} requests, {len(failed)} failed; pinned to w1 during the partition: "
        f"{sorted(set(pinned))} x{len(pinned)}; w1 heard from again {back_s:.1f} s after healing"
    )
    assert not failed, failed[:5]
    assert seen_vouched, "the frontend never listed w1 as kept by its request plane"
    assert set(pinned) == {"200"}, pinned
    assert json.loads(dep.get("/health"))["status"] == "ok"
