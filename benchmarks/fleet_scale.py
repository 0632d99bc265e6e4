"""A fleet simulator: one frontend joining N synthetic workers over a real nats-server.

    PYTHONPATH=. .venv/bin/python benchmarks/fleet_scale.py --workers 100 --blocks 4096 --procs 2 \\
        --rate 0.5 --duration 20 [--phases steady,restart,cut] [--conns worker|process] [--json out.json]

What runs (all on loopback; every process is started with PR_SET_PDEATHSIG and stopped at the
end, also on error or Ctrl-C; the modules beside this one: ``fleet_workers`` the synthetic
workers, ``fleet_proxy`` the link proxy, ``fleet_procs`` the processes, ``fleet_traffic`` the
load and the probes, ``fleet_measure`` what is read off the processes and the servers):

* a private nats-server (``interlock.runtime.nats_server``) with its monitoring port on;
* ``--procs`` processes of synthetic workers (``fleet_workers.py``): N product ``Worker`` s
  around a ``FakeEngine`` whose cache is pre-filled with ``--blocks`` blocks (chains of 32
  blocks, each starting with one of 8 system prompts shared by every worker), speaking the
  real wire protocol: discovery heartbeats, the TCP request plane, KV events, load reports,
  snapshots on re-sync requests. ``--conns worker`` gives each worker its own NATS connection
  (as one worker per process has in production), ``process`` one per process;
* ``interlock frontend`` (the product's command, kv policy), connected to NATS through a TCP
  proxy (``fleet_proxy.py``) so that its link alone can be cut;
* an open-loop client (Poisson arrivals, ``--rate`` requests/s per worker in all):
  ``/v1/completions`` with token-id prompts, a random prefix of one worker's cached chain plus
  new tokens (so routing by KV matters and every request stores new blocks), asking for the
  routing decision (``x-interlock-explain``).

Phases (a row each): ``start`` (always first: the frontend starts into the running fleet),
then ``--phases`` in order: ``steady`` (``--duration`` s of load), ``restart`` (traffic held
and in-flight requests finished, as a load balancer would; SIGTERM; a new frontend; traffic
again once ``/health`` is 200), ``cut`` (the frontend's NATS link cut for ``--cut-s`` s, in
``--cut-mode`` hang or drop, then restored), ``second`` (a second frontend joins beside the
first, which keeps the load; stopped at the phase's end), ``remote`` (the same with
``--kv-index remote``: it keeps no index, asks the first per request, and takes the load once
converged), ``shards`` (``--shards`` frontends each keeping a shard of the index), ``index_restart``
(the index apart from the serving loop: a ``remote`` frontend takes the load and the first, the
only index, restarts and pulls every state again; the row is the serving one's requests from
the restart on). A phase lasts ``--duration`` s, or until it has
converged if that takes longer.

What is measured, per phase:

* **healthy s**: from the frontend's spawn until ``/health`` is 200 (one worker known): the
  load is sent from then on, as a load balancer would;
* **discovered s**: from the frontend's spawn until its ``/metrics`` lists every worker (a
  worker appears there once the router knows it and has its load report: at most one idle
  report interval, 1 s, after discovery); for ``cut``, from the restore until ``/health``
  says the control plane is ``connected`` again;
* **converged s**: from the spawn (or the restore) until the router sends a probe of every
  worker's held prefix to that worker with its full overlap. ``start``/``restart``: each
  worker's chain 0 (32 blocks, never used by the load), which the router can know only from
  the worker's snapshot: the router's index is exactly what it has applied, so this is the
  time until every snapshot is applied. The probing starts once the frontend's metrics say
  every state is applied (polled every 0.25 s; rounds of probes from the start would load the
  frontend far more than the traffic whose latency the phase measures): if the first round
  routes every probe to its holder, that moment is the time, else the round that does. ``cut``: prefixes stored on a sample of workers (up to
  16) while the link was down (their KV events are lost in ``drop`` mode, so only a re-sync
  brings them). Probe prompts end in a token the synthetic engine never stores, so probing
  changes no cache;
* **KV lag**: every ``--lag-interval`` s a new 4-block prefix is stored on a random worker
  (a request pinned to it with ``x-worker-id``); lag = from that reply until a probe of the
  prefix is routed to that worker with the full overlap (probes back to back, each a few ms);
  A lag under one probe's round trip reads as that round trip;
* **slow consumers**: nats-server's ``slow_consumers`` counter (``/varz``) over the phase: each
  one is a connection the server cut (at 300 x 4,096 blocks, the frontend's); the largest
  ``pending_bytes`` of the frontend's connection (``/connz``, sampled every 0.5 s); the
  frontend's **link outages** (``interlock_control_plane_outages_total``, since it started);
* **re-syncs asked / KV pulls**: the frontend's ``interlock_router_resyncs_total`` (a gap in a
  worker's KV event stream) and, where the router pulls KV state over the request plane
  (``interlock_router_kv_syncs_total``), its pulls by kind and the bytes they moved
  (``..._kv_sync_bytes_total`` + ``..._kv_replica_bytes_total``); all since the frontend
  started. ``second`` adds the second frontend's, once it converged, and its CPU until then;
* **frontend CPU** s/s over the phase and peak RSS (``/proc``); the fleet's and nats-server's
  CPU s/s (on this machine they share its cores with the frontend);
* **NATS** messages and bytes per second in and out (``/varz``);
* **requests**: latency p50/p99 of the load, failures (non-200 or no answer within 30 s),
  and the share routed to the worker whose chain the prompt extends ("to holder").

The table heads with the command line, where ``interlock`` was imported from, the date, the CPU
(``lscpu``), the snapshot size per worker and in all (as one KV event batch, what a re-sync
publishes on the event plane), the NATS throughput on this machine (``nats_throughput``) and
how long those snapshots would take at it, how long the fleet took to start and the machine's load average.
Each phase's row is also printed to stderr as soon as it ends.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import functools
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from fleet_measure import Frontend, Peaks, PhaseResult, Sampler, cpu_s, nats_throughput
from fleet_procs import FrontendProcess, free_port, start_fleet, start_proxy, stop
from fleet_traffic import LAG_BLOCKS, Load, converge, kv_lag, store_fresh
from fleet_workers import ChainShape, FleetLaunch, chain_tokens, snapshot_bytes, worker_id

from interlock.runtime.nats_server import NatsServer

MODEL = "smollm2"
CANARIES = 16
PHASES = ("steady", "restart", "cut", "second", "remote", "shards", "index_restart")


# ---- phases ----


@dataclass
class Bench:
    args: argparse.Namespace
    shape: ChainShape
    fe_proc: FrontendProcess
    fe: Frontend
    sampler: Sampler
    load: Load
    proxy: subprocess.Popen[bytes]
    fleet_pids: list[int]
    nats_pid: int
    nats_url: str
    rng: random.Random = field(default_factory=lambda: random.Random(7))

    def probes(self) -> dict[str, tuple[list[int], int]]:
        return {
            worker_id(w): (chain_tokens(self.shape, w, 0), self.shape.lengths[0])
            for w in range(self.args.workers)
        }

    async def measure(self, name: str, body: Callable[[PhaseResult], Awaitable[None]]) -> PhaseResult:
        """Run ``body`` as phase ``name`` and take its figures over it."""
        result = PhaseResult(name)
        self.sampler.peaks = Peaks()
        n0 = await self.sampler.counters()
        starts, pulled0 = self.fe_proc.starts, _pulled(await self.fe.counters())
        cpu0 = (self.fe_proc.cpu(), sum(cpu_s(p) for p in self.fleet_pids), cpu_s(self.nats_pid))
        self.load.phase = result
        await body(result)
        n1 = await self.sampler.counters()
        dt = n1.t - n0.t
        result.wall_s = dt
        result.frontend_cpu = (self.fe_proc.cpu() - cpu0[0]) / dt
        result.fleet_cpu = (sum(cpu_s(p) for p in self.fleet_pids) - cpu0[1]) / dt
        result.nats_cpu = (cpu_s(self.nats_pid) - cpu0[2]) / dt
        result.slow_consumers = n1.slow_consumers - n0.slow_consumers
        result.nats_in_msgs_s = (n1.in_msgs - n0.in_msgs) / dt
        result.nats_out_msgs_s = (n1.out_msgs - n0.out_msgs) / dt
        result.nats_out_mb_s = (n1.out_bytes - n0.out_bytes) / dt / 1e6
        result.frontend_rss_mib = self.sampler.peaks.rss_mib
        result.pending_mib = self.sampler.peaks.pending_bytes / 2**20
        result.counters = await self.fe.counters()
        result.pulled_mb = (
            _pulled(result.counters) - (pulled0 if self.fe_proc.starts == starts else 0)
        ) / 1e6
        return result

    async def lag_until(self, result: PhaseResult, end: float, fe: Frontend | None = None) -> None:
        """KV-lag samples every ``--lag-interval`` s until ``end`` (through ``fe``, else the first)."""
        while time.monotonic() < end:
            worker = worker_id(self.rng.randrange(self.args.workers))
            lag = await kv_lag(fe or self.fe, worker, self.rng, self.args.lag_timeout)
            if lag is None:
                result.lag_timeouts += 1
            else:
                result.lags_ms.append(lag * 1e3)
            await asyncio.sleep(max(0.0, min(self.args.lag_interval, end - time.monotonic())))

    async def join(self, result: PhaseResult) -> None:
        """A frontend just spawned: time its discovery and convergence, open traffic at /health 200."""
        t0 = self.fe_proc.spawned
        deadline = t0 + self.args.converge_timeout

        async def discovered() -> None:
            while time.monotonic() < deadline:
                if len(await self.fe.known_workers()) >= self.args.workers:
                    result.discovered_s = time.monotonic() - t0
                    return
                await asyncio.sleep(0.25)
            result.timed_out.append("discovered")

        watcher = asyncio.create_task(discovered())
        try:
            await self._healthy(self.fe, self.fe_proc, result)
        except RuntimeError:
            watcher.cancel()
            raise
        self.load.gate.set()
        done = await converge(self.fe, self.probes(), deadline, applied=self._applied(self.fe))
        self._converged(result, done, t0)
        await watcher

    async def _healthy(self, fe: Frontend, proc: FrontendProcess, result: PhaseResult) -> None:
        """Wait for ``/health`` 200 from a frontend just spawned (``healthy_s``)."""
        deadline = proc.spawned + self.args.converge_timeout
        while not await fe.healthy():
            if time.monotonic() > deadline or proc.pid is None:
                raise RuntimeError(f"the frontend did not become healthy; see {proc.logs}")
            await asyncio.sleep(0.1)
        result.healthy_s = time.monotonic() - proc.spawned

    def _applied(self, fe: Frontend) -> Callable[[], Awaitable[bool]]:
        """Whether ``fe``'s metrics say it has every worker's whole state (``converge``)."""
        return functools.partial(fe.states_applied, self.args.workers)

    @staticmethod
    def _converged(result: PhaseResult, done: float | None, since: float) -> None:
        if done is None:
            result.timed_out.append("converged")
        else:
            result.converged_s = done - since

    async def start(self, result: PhaseResult) -> None:
        self.fe_proc.start()
        await self.join(result)

    async def steady(self, result: PhaseResult) -> None:
        await self.lag_until(result, time.monotonic() + self.args.duration)

    async def restart(self, result: PhaseResult) -> None:
        t0 = time.monotonic()
        await self.load.hold()
        self.fe_proc.stop()
        self.fe_proc.start()
        await self.join(result)
        await self.lag_until(result, t0 + self.args.duration)

    async def second(self, result: PhaseResult) -> None:
        """A second frontend joins beside the first (which keeps the load): its convergence,
        and how it got the workers' states (``joined``: copied from the first, or pulled)."""
        await self._beside(result, "second", ())

    async def remote(self, result: PhaseResult) -> None:
        """A frontend without an index (``--kv-index remote``) joins beside the first and, once
        converged (routing to the holders by the first one's lookups), takes the whole load:
        the row's requests went through it, its CPU s/s is ``joined_cpu_s``, and the first
        frontend's CPU is then ingestion and lookups alone."""
        await self._beside(result, "remote", ("--kv-index", "remote"))

    async def index_restart(self, result: PhaseResult) -> None:
        """The index in a process apart from the serving loop: a frontend without an index
        (``--kv-index remote``) joins, converges on the first's lookups and takes the load; then
        the first (the only index) restarts and pulls every state again while the requests go
        through the other. The row is from the restart on: the requests' latency (the serving
        loop's, with no ingestion on it), the convergence as that frontend routes (probes
        once the first's metrics say every state is applied), ``joined_cpu_s`` the serving
        frontend's CPU s/s and ``frontend CPU`` the index's."""
        proc = FrontendProcess(
            self.nats_url,
            self.fe_proc.logs,
            self.fe_proc.lease,
            tag="serving",
            extra=("--kv-index", "remote"),
        )
        self.load.phase = PhaseResult("before")  # its own start is not the row's
        proc.start()
        try:
            fe = Frontend(self.fe.session, proc.url, MODEL)
            await self._healthy(fe, proc, PhaseResult("before"))
            if await converge(fe, self.probes(), proc.spawned + self.args.converge_timeout) is None:
                result.timed_out.append("converged")
                return
            await self.load.hold()  # nothing in flight to the first when it stops
            self.load.fe, self.load.phase = fe, result
            self.load.gate.set()
            restarted = time.monotonic()
            cpu = proc.cpu()
            self.fe_proc.stop()
            self.fe_proc.start()
            await self._healthy(self.fe, self.fe_proc, result)
            done = await converge(
                fe, self.probes(), restarted + self.args.converge_timeout, applied=self._applied(self.fe)
            )
            self._converged(result, done, restarted)
            await self.lag_until(result, restarted + self.args.duration, fe)
            result.joined = await fe.counters()
            result.joined_cpu_s = (proc.cpu() - cpu) / max(time.monotonic() - restarted, 1e-9)
        finally:
            self.load.fe = self.fe
            proc.stop()

    async def shards(self, result: PhaseResult) -> None:
        """``--shards`` frontends, each keeping one shard of the index (``--kv-shard I/N``),
        join beside the first; once the first of them has converged (it routes by asking every
        shard), the load and the KV-lag probes go through it. ``shard_cpu_s``: each one's CPU
        s/s from then on (the first: serving, its shard's ingestion and lookups; the others:
        their shard's ingestion and the lookups)."""
        n = self.args.shards
        procs = [
            FrontendProcess(
                self.nats_url,
                self.fe_proc.logs,
                self.fe_proc.lease,
                tag=f"shard{i}",
                extra=("--kv-shard", f"{i}/{n}"),
            )
            for i in range(n)
        ]
        for proc in procs:
            proc.start()
        try:
            fes = [Frontend(self.fe.session, proc.url, MODEL) for proc in procs]
            for fe, proc in zip(fes, procs, strict=True):
                await self._healthy(fe, proc, result)
            done = await converge(fes[0], self.probes(), procs[0].spawned + self.args.converge_timeout)
            self._converged(result, done, procs[0].spawned)
            cpus, since = [proc.cpu() for proc in procs], time.monotonic()
            self.load.fe = fes[0]
            try:  # a whole --duration once converged: the shards' own figures need a window
                await self.lag_until(result, time.monotonic() + self.args.duration, fes[0])
            finally:
                self.load.fe = self.fe
            elapsed = max(time.monotonic() - since, 1e-9)
            result.shard_cpu_s = [(proc.cpu() - c) / elapsed for proc, c in zip(procs, cpus, strict=True)]
            result.joined = await fes[0].counters()
        finally:
            for proc in procs:
                proc.stop()

    async def _beside(self, result: PhaseResult, tag: str, extra: tuple[str, ...]) -> None:
        t0 = time.monotonic()
        proc = FrontendProcess(self.nats_url, self.fe_proc.logs, self.fe_proc.lease, tag=tag, extra=extra)
        proc.start()
        try:
            fe = Frontend(self.fe.session, proc.url, MODEL)
            await self._healthy(fe, proc, result)
            applied = self._applied(fe) if tag == "second" else None  # remote: it keeps no index
            done = await converge(
                fe, self.probes(), proc.spawned + self.args.converge_timeout, applied=applied
            )
            self._converged(result, done, proc.spawned)
            cpu, since = proc.cpu(), time.monotonic()
            result.joined = await fe.counters()
            if tag == "remote":  # the load goes through it; the first keeps ingesting, answers lookups
                self.load.fe = fe
            try:
                await self.lag_until(result, t0 + self.args.duration)
            finally:
                self.load.fe = self.fe
            if tag == "remote":
                result.joined = await fe.counters()
                result.joined_cpu_s = (proc.cpu() - cpu) / max(time.monotonic() - since, 1e-9)
            else:
                result.joined_cpu_s = cpu
        finally:
            proc.stop()

    async def cut(self, result: PhaseResult) -> None:
        t0 = time.monotonic()
        self.proxy.send_signal(signal.SIGUSR1)
        await asyncio.sleep(min(1.0, self.args.cut_s / 2))
        canaries: dict[str, tuple[list[int], int]] = {}
        for w in self.rng.sample(range(self.args.workers), min(CANARIES, self.args.workers)):
            prefix, stored = await store_fresh(self.fe, worker_id(w), self.rng, LAG_BLOCKS)
            if stored.ok:
                canaries[worker_id(w)] = (prefix, LAG_BLOCKS)
            else:
                result.errors.append(f"canary on {worker_id(w)}: {stored.error}")
        await asyncio.sleep(max(0.0, t0 + self.args.cut_s - time.monotonic()))
        self.proxy.send_signal(signal.SIGUSR2)
        restored = time.monotonic()
        deadline = restored + self.args.converge_timeout

        async def link_up() -> None:
            while time.monotonic() < deadline:
                if await self.fe.link_state() == "connected":
                    result.discovered_s = time.monotonic() - restored
                    return
                await asyncio.sleep(0.1)
            result.timed_out.append("discovered")

        watcher = asyncio.create_task(link_up())
        done = await converge(self.fe, canaries, deadline)
        self._converged(result, done, restored)
        await watcher
        await self.lag_until(result, t0 + self.args.duration)


# ---- report ----


def _pct(values: list[float], q: float) -> str:
    return f"{np.percentile(values, q):.0f}" if values else "-"


def _s(r: PhaseResult, what: str) -> str:
    value = getattr(r, f"{what}_s")
    if what in r.timed_out:
        return "timeout"
    return "-" if value is None else f"{value:.1f}"


def _syncs(counts: dict[str, int]) -> str:
    kinds = ("pulls_snapshot", "pulls_replay", "pulls_failed", "pulls_replica", "pulls_replica_missing")
    pulls = [f"{counts[k]} {k[6:]}" for k in kinds if counts.get(k)]
    return f"{counts.get('resyncs', 0)} / {', '.join(pulls) or '-'} ({_pulled(counts) / 1e6:.1f} MB)"


def _pulled(counts: dict[str, int]) -> int:
    """Bytes of KV state a frontend pulled, from workers and from other replicas."""
    return counts.get("bytes_sync", 0) + counts.get("bytes_replica", 0)


def _all_syncs(r: PhaseResult) -> str:
    if not r.joined:
        return _syncs(r.counters)
    if r.name == "shards":
        cpu = " / ".join(f"{c:.2f}" for c in r.shard_cpu_s)
        return f"{_syncs(r.counters)}; shards: {_syncs(r.joined)}, CPU s/s {cpu} (the first serves)"
    if r.name in ("remote", "index_restart"):
        lookups = r.joined.get("lookups_answered", 0)
        return f"{_syncs(r.counters)}; frontend without an index: {lookups} lookups, {r.joined_cpu_s:.2f} CPU s/s"
    return (
        f"{_syncs(r.counters)}; second frontend: {_syncs(r.joined)}, {r.joined_cpu_s:.1f} CPU s to converge"
    )


def table(results: list[PhaseResult]) -> str:
    head = (
        "| phase | healthy s | discovered s | converged s | slow consumers | frontend pending MiB (max) | "
        "frontend CPU s/s | frontend RSS MiB | fleet CPU s/s | nats CPU s/s | NATS msgs/s in / out | "
        "NATS MB/s out | KV lag p50 / p99 ms (n) | request p50 / p99 ms | requests ok | failed | "
        "to holder | link outages | KV pulled in phase MB | re-syncs asked / KV pulls (MB) |"
    )
    return "\n".join([head, "|" + "---|" * (head.count("|") - 1), *(row(r) for r in results)])


def row(r: PhaseResult) -> str:
    """One phase as a row of ``table``."""
    lag = f"{_pct(r.lags_ms, 50)} / {_pct(r.lags_ms, 99)} ({len(r.lags_ms)}"
    lag += f", {r.lag_timeouts} timed out)" if r.lag_timeouts else ")"
    holder = f"{100 * r.to_holder / r.ok:.0f} %" if r.ok else "-"
    cells = [
        r.name,
        _s(r, "healthy"),
        _s(r, "discovered"),
        _s(r, "converged"),
        str(r.slow_consumers),
        f"{r.pending_mib:.1f}",
        f"{r.frontend_cpu:.2f}",
        f"{r.frontend_rss_mib:.0f}",
        f"{r.fleet_cpu:.2f}",
        f"{r.nats_cpu:.2f}",
        f"{r.nats_in_msgs_s:,.0f} / {r.nats_out_msgs_s:,.0f}",
        f"{r.nats_out_mb_s:.1f}",
        lag,
        f"{_pct(r.latencies_ms, 50)} / {_pct(r.latencies_ms, 99)}",
        str(r.ok),
        str(r.failed),
        holder,
        str(r.counters.get("outages", "-")),
        f"{r.pulled_mb:.2f}",
        _all_syncs(r),
    ]
    return "| " + " | ".join(cells) + " |"


def cpu_model() -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    return "?"


def load_average() -> str:
    """The 1-minute load average: other work on the machine shares its cores."""
    with contextlib.suppress(OSError):
        return Path("/proc/loadavg").read_text().split()[0]
    return "?"


def header(
    args: argparse.Namespace, snap: int, max_payload: int, fleet_s: float, loads: tuple[str, str]
) -> str:
    import interlock

    total = snap * args.workers / 1e6

    lines = [
        f"`{shlex.join(['python', *sys.argv])}`",
        "",
        f"interlock from {Path(interlock.__file__).parent.parent}",
        f"{datetime.date.today().isoformat()}, {os.cpu_count()} vCPU ({cpu_model()}); "
        f"{args.workers} workers x {args.blocks} blocks in {args.procs} processes "
        f"(NATS connections per {args.conns}); load {args.rate:g} req/s per worker "
        f"({args.rate * args.workers:g} req/s); cut {args.cut_s:g} s ({args.cut_mode})",
        f"snapshot {snap / 1e3:.0f} kB per worker, {total:.1f} MB for the fleet "
        f"(nats-server max_payload {max_payload / 1e6:.2f} MB); fleet started in {fleet_s:.1f} s; "
        f"load average {loads[0]} at the start, {loads[1]} at the end",
    ]
    if snap > max_payload:
        lines.append(
            f"**a snapshot exceeds the server's max_payload ({snap / 1e6:.2f} MB > "
            f"{max_payload / 1e6:.2f} MB): it cannot be published as one NATS message**"
        )
    return "\n".join(lines)


# ---- main ----


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from interlock.model_store import resolve_model

    shape = ChainShape(blocks=args.blocks, seed=args.seed)
    model_path = str(resolve_model(MODEL, progress=False))
    snap = await snapshot_bytes(shape)
    loads = (load_average(), "")
    t_run = time.monotonic()
    with contextlib.ExitStack() as stack:
        logs = Path(tempfile.mkdtemp(prefix="fleet-scale-"))
        if not args.keep_logs:
            stack.callback(shutil.rmtree, logs, ignore_errors=True)
        monitor_port = free_port()
        nats = stack.enter_context(NatsServer(monitor_port=monitor_port))
        nats_mb_s = await nats_throughput(nats.url)
        proxy, proxy_port = start_proxy(nats.port, args.cut_mode)
        stack.callback(stop, proxy)
        fe_proc = FrontendProcess(
            f"nats://127.0.0.1:{proxy_port}", logs, (args.heartbeat_interval, args.heartbeat_timeout)
        )
        stack.callback(fe_proc.stop)
        procs: list[subprocess.Popen[bytes]] = []
        stack.callback(lambda: [stop(p) for p in procs])
        template = FleetLaunch(
            nats_url=nats.url,
            first=0,
            count=0,
            shape=shape,
            model=MODEL,
            model_path=model_path,
            conns=args.conns,
            heartbeat_interval=args.heartbeat_interval,
            lease_timeout=args.heartbeat_timeout,
        )
        started, fleet_s = start_fleet(template, args.workers, args.procs, logs)
        procs += started
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=512)) as session:
            fe = Frontend(session, fe_proc.url, MODEL)
            sampler = Sampler(
                session, f"http://127.0.0.1:{monitor_port}", lambda: fe_proc.pid, [p.pid for p in procs]
            )
            max_payload = int((await sampler.varz()).get("max_payload", 1 << 20))
            load = Load(fe, shape, args.workers, args.rate * args.workers, args.max_tokens, args.seed)
            bench = Bench(
                args,
                shape,
                fe_proc,
                fe,
                sampler,
                load,
                proxy,
                [p.pid for p in procs],
                nats.pid or 0,
                nats.url,
            )
            tasks = [asyncio.create_task(sampler.run()), asyncio.create_task(load.run())]
            results = []
            try:
                for name in ["start", *args.phases]:
                    results.append(await bench.measure(name, getattr(bench, name)))
                    print(row(results[-1]), file=sys.stderr, flush=True)  # progress of a long run
                await load.hold()
            finally:
                for task in tasks:
                    task.cancel()
                for task in tasks:
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
    wall = time.monotonic() - t_run
    loads = (loads[0], load_average())
    report = header(args, snap, max_payload, fleet_s, loads)
    pulled = results[0].pulled_mb if results else 0.0
    report += (
        f"\nNATS throughput {nats_mb_s:.0f} MB/s (one nats-py publisher to one subscriber, 150 kB "
        f"messages, measured before the fleet started): the {pulled:.1f} MB the frontend pulled at "
        f"start need {pulled / nats_mb_s:.2f} s at it (1.5x: {1.5 * pulled / nats_mb_s:.2f} s); the "
        f"snapshots pushed the old way, {snap * args.workers / 1e6:.0f} MB, would need "
        f"{snap * args.workers / 1e6 / nats_mb_s:.1f} s"
    )
    report += "\n\n" + table(results)
    report += f"\n\nrun took {wall:.0f} s"
    errors = [f"{r.name}: {e}" for r in results for e in r.errors]
    if errors:
        report += "\n\nfirst errors:\n" + "\n".join(f"- {e}" for e in errors[:10])
    if args.keep_logs:
        report += f"\n\nlogs in {logs}"
    return {
        "report": report,
        "snapshot_bytes": snap,
        "nats_mb_s": nats_mb_s,
        "max_payload": max_payload,
        "fleet_start_s": fleet_s,
        "wall_s": wall,
        "phases": [asdict(r) for r in results],
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=100)
    p.add_argument("--blocks", type=int, default=4096, help="cached blocks per worker (16 tokens each)")
    p.add_argument("--procs", type=int, default=2, help="processes the workers are spread over")
    p.add_argument(
        "--conns", choices=("worker", "process"), default="worker", help="a NATS connection per ..."
    )
    p.add_argument("--rate", type=float, default=2.0, help="requests/s per worker (open loop, all together)")
    p.add_argument("--duration", type=float, default=30.0, help="seconds per phase")
    p.add_argument(
        "--phases",
        type=lambda s: [x for x in s.split(",") if x],
        default=list(PHASES),
        help=f"after start, comma-separated from {','.join(PHASES)}",
    )
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--shards", type=int, default=2, help="index shards in the shards phase")
    p.add_argument("--cut-s", type=float, default=5.0, help="how long the frontend's NATS link is cut")
    p.add_argument("--cut-mode", choices=("hang", "drop"), default="hang")
    p.add_argument("--lag-interval", type=float, default=1.0, help="seconds between KV-lag samples")
    p.add_argument("--lag-timeout", type=float, default=10.0, help="a KV-lag sample gives up after this")
    p.add_argument("--converge-timeout", type=float, default=180.0)
    p.add_argument("--heartbeat-interval", type=float, default=1.0)
    p.add_argument("--heartbeat-timeout", type=float, default=5.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    p.add_argument("--keep-logs", action="store_true", help="keep the processes' logs (path printed)")
    args = p.parse_args(argv)
    unknown = [x for x in args.phases if x not in PHASES]
    if unknown:
        p.error(f"unknown phases {unknown}: choose from {', '.join(PHASES)}")
    if args.blocks < 8:
        p.error("--blocks must be at least 8")
    return args


def main() -> None:
    args = parse_args()
    out = asyncio.run(run(args))
    print(out["report"])
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
