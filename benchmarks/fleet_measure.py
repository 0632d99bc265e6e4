"""What ``fleet_scale.py`` observes: a process's CPU and memory, nats-server's monitoring
endpoints, and the frontend over HTTP (completions with token-id prompts, the routing decision
each one got, the frontend's ``/metrics`` and ``/health``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from interlock.frontend.backend import HEADER_EXPLAIN, HEADER_WORKER_ID
from interlock.router.dispatcher import EXPLAIN_HEADER

_TICK = os.sysconf("SC_CLK_TCK")
_WORKER_LABEL = re.compile(r'^interlock_worker_kv_blocks_capacity\{worker="([^"]+)"', re.M)
_RESYNCS = re.compile(r"^interlock_router_resyncs_total\{[^}]*\} (\d+)", re.M)
_OUTAGES = re.compile(r"^interlock_control_plane_outages_total (\d+)", re.M)
_PULLS = re.compile(r'^interlock_router_kv_syncs_total\{kind="(\w+)"\} (\d+)', re.M)
_LOOKUPS = re.compile(r'^interlock_router_kv_lookups_total\{outcome="(\w+)"\} (\d+)', re.M)
_PULLED = re.compile(r"^interlock_router_kv_(sync|replica)_bytes_total (\d+)", re.M)
_SYNCING = re.compile(r"^interlock_router_kv_syncing_workers (\d+)", re.M)


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def rss_mib(pid: int) -> float:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


@dataclass
class PhaseResult:
    name: str
    wall_s: float = 0.0
    healthy_s: float | None = None
    """From the spawn until ``/health`` is 200 (None: not measured in this phase)."""
    discovered_s: float | None = None
    converged_s: float | None = None
    timed_out: list[str] = field(default_factory=list)
    """Which of discovered and converged did not happen within ``--converge-timeout``."""
    slow_consumers: int = 0
    frontend_cpu: float = 0.0
    frontend_rss_mib: float = 0.0
    fleet_cpu: float = 0.0
    nats_cpu: float = 0.0
    nats_in_msgs_s: float = 0.0
    nats_out_msgs_s: float = 0.0
    nats_out_mb_s: float = 0.0
    pending_mib: float = 0.0
    lags_ms: list[float] = field(default_factory=list)
    lag_timeouts: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    ok: int = 0
    failed: int = 0
    to_holder: int = 0
    counters: dict[str, int] = field(default_factory=dict)
    """The frontend's counters at the phase's end (``Frontend.counters``)."""
    pulled_mb: float = 0.0
    """KV state the (first) frontend pulled during the phase, from workers and replicas."""
    joined: dict[str, int] = field(default_factory=dict)
    """``second``: the second frontend's counters once it converged."""
    joined_cpu_s: float = 0.0
    """``second``: the second frontend's CPU seconds until it converged; ``remote``: the
    frontend without an index, CPU seconds per second after it converged."""
    shard_cpu_s: list[float] = field(default_factory=list)
    """``shards``: each shard frontend's CPU seconds per second after the first converged."""
    errors: list[str] = field(default_factory=list)


@dataclass
class NatsCounters:
    t: float
    in_msgs: int
    out_msgs: int
    in_bytes: int
    out_bytes: int
    slow_consumers: int


@dataclass
class Peaks:
    """Maxima sampled over a phase."""

    rss_mib: float = 0.0
    pending_bytes: int = 0
    fleet_rss_mib: float = 0.0


@dataclass
class Sampler:
    """Every ``interval_s``: the frontend's RSS, its NATS connection's pending bytes (the
    connection named ``frontend_conn``), the fleet's RSS."""

    session: aiohttp.ClientSession
    monitor_url: str
    frontend_pid: Any  # () -> int | None
    fleet_pids: list[int]
    frontend_conn: str = "interlock-frontend"
    interval_s: float = 0.5
    peaks: Peaks = field(default_factory=Peaks)

    async def varz(self) -> dict[str, Any]:
        async with self.session.get(f"{self.monitor_url}/varz") as resp:
            return dict(await resp.json())

    async def counters(self) -> NatsCounters:
        v = await self.varz()
        return NatsCounters(
            time.monotonic(), v["in_msgs"], v["out_msgs"], v["in_bytes"], v["out_bytes"], v["slow_consumers"]
        )

    async def pending_bytes(self) -> int:
        """The largest pending of a connection named ``frontend_conn`` (0: none open)."""
        url = f"{self.monitor_url}/connz?limit=4096&sort=pending"
        async with self.session.get(url) as resp:
            conns = (await resp.json()).get("connections") or []
        return max(
            (c.get("pending_bytes", 0) for c in conns if c.get("name") == self.frontend_conn), default=0
        )

    async def run(self) -> None:
        while True:
            pid = self.frontend_pid()
            if pid is not None:
                self.peaks.rss_mib = max(self.peaks.rss_mib, rss_mib(pid))
            fleet = sum(rss_mib(p) for p in self.fleet_pids)
            self.peaks.fleet_rss_mib = max(self.peaks.fleet_rss_mib, fleet)
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, ValueError):
                self.peaks.pending_bytes = max(self.peaks.pending_bytes, await self.pending_bytes())
            await asyncio.sleep(self.interval_s)


@dataclass(frozen=True)
class Reply:
    ok: bool
    latency_s: float
    done: float
    """``time.monotonic()`` when the reply was read."""
    worker: str = ""
    overlap: int = -1
    error: str = ""


def parse_route(header: str | None) -> tuple[str, int]:
    """``worker=W; reason=R; overlap=N; ...`` -> (W, N)."""
    parts = dict(p.strip().partition("=")[::2] for p in (header or "").split(";") if "=" in p)
    try:
        return parts.get("worker", ""), int(parts.get("overlap", "-1"))
    except ValueError:
        return parts.get("worker", ""), -1


@dataclass
class Frontend:
    """The frontend as a client sees it."""

    session: aiohttp.ClientSession
    url: str
    model: str
    timeout_s: float = 30.0

    async def complete(self, prompt: list[int], max_tokens: int, *, pin: str | None = None) -> Reply:
        headers = {HEADER_EXPLAIN: "1"}
        if pin is not None:
            headers[HEADER_WORKER_ID] = pin
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
        t0 = time.monotonic()
        try:
            async with self.session.post(
                f"{self.url}/v1/completions",
                json=body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            ) as resp:
                text = await resp.text()
                done = time.monotonic()
                worker, overlap = parse_route(resp.headers.get(EXPLAIN_HEADER))
                if resp.status != 200:
                    return Reply(False, done - t0, done, worker, overlap, f"{resp.status} {text[:120]}")
                return Reply(True, done - t0, done, worker, overlap)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            done = time.monotonic()
            return Reply(False, done - t0, done, error=f"{type(exc).__name__}: {exc}"[:160])

    async def _get(self, path: str) -> tuple[int, str]:
        try:
            async with self.session.get(
                f"{self.url}{path}", timeout=aiohttp.ClientTimeout(total=self.timeout_s)
            ) as resp:
                return resp.status, await resp.text()
        except (TimeoutError, aiohttp.ClientError, OSError):
            return 0, ""

    async def healthy(self) -> bool:
        return (await self._get("/health"))[0] == 200

    async def link_state(self) -> str:
        """The control plane's state in ``/health`` (``connected``, ...), "" if unreadable."""
        import json

        status, text = await self._get("/health")
        with contextlib.suppress(ValueError, AttributeError):
            return str(json.loads(text).get("control_plane", {}).get("state", ""))
        return ""

    async def known_workers(self) -> set[str]:
        """Workers the router knows and has a load report of (``/metrics``)."""
        status, text = await self._get("/metrics")
        return set(_WORKER_LABEL.findall(text)) if status == 200 else set()

    async def states_applied(self, workers: int) -> bool:
        """The frontend's metrics say it has applied a whole state of each of ``workers``
        workers (pulled from them or copied from a replica) and pulls none now."""
        status, text = await self._get("/metrics")
        if status != 200:
            return False
        kinds = dict(_PULLS.findall(text))
        whole = int(kinds.get("snapshot", 0)) + int(kinds.get("replica", 0))
        syncing = _SYNCING.search(text)
        return whole >= workers and syncing is not None and syncing.group(1) == "0"

    async def counters(self) -> dict[str, int]:
        """Since this frontend started: its NATS link's outages, re-syncs asked on the event
        plane (``resyncs``), and where the router pulls KV state over the request plane, its
        pulls by kind (``pulls_snapshot``, ...) and the bytes they moved, from workers
        (``bytes_sync``) and from other replicas (``bytes_replica``)."""
        status, text = await self._get("/metrics")
        if status != 200:
            return {}
        counts = {
            "outages": sum(int(n) for n in _OUTAGES.findall(text)),
            "resyncs": sum(int(n) for n in _RESYNCS.findall(text)),
        }
        counts.update({f"pulls_{kind}": int(n) for kind, n in _PULLS.findall(text)})
        counts.update({f"bytes_{source}": int(n) for source, n in _PULLED.findall(text)})
        counts.update({f"lookups_{outcome}": int(n) for outcome, n in _LOOKUPS.findall(text)})
        return counts


async def nats_throughput(url: str, total_bytes: int = 64 << 20, size: int = 150_000) -> float:
    """MB/s one nats-py client publishing ``size``-byte messages gets through the server to one
    nats-py subscriber (what a pushed snapshot would ride on), on this machine now."""
    import nats

    pub, sub_nc = (
        await nats.connect(url, name="throughput-pub"),
        await nats.connect(url, name="throughput-sub"),
    )
    count = max(1, total_bytes // size)
    got = 0
    done = asyncio.Event()

    async def on_msg(msg: Any) -> None:
        nonlocal got
        got += 1
        if got == count:
            done.set()

    try:
        sub = await sub_nc.subscribe("throughput.probe", cb=on_msg, pending_bytes_limit=1 << 30)
        await sub_nc.flush()
        payload = b"x" * size
        t0 = time.perf_counter()
        for _ in range(count):
            await pub.publish("throughput.probe", payload)
        await pub.flush()
        await asyncio.wait_for(done.wait(), 120)
        dt = time.perf_counter() - t0
        await sub.unsubscribe()
    finally:
        await pub.close()
        await sub_nc.close()
    return count * size / dt / 1e6
