"""What a durable JetStream stream of every KV event would cost, against the replica copy we chose.

A new frontend replica must rebuild the KV index (which worker holds which block). Interlock
copies it from a live replica over the request plane (about 9.2 bytes a block). The alternative
(NVIDIA Dynamo's) keeps every ``KVEventBatch`` in a JetStream stream and a new replica replays it.
This script measures that alternative on this machine:

    PYTHONPATH=. .venv/bin/python benchmarks/jetstream_cost.py --workers 300 --rate 600 --duration 20

Two modes, one after the other, each on a fresh private nats-server (loopback, JetStream enabled,
its store in a temporary directory that is removed at the end):

* ``core``: no stream; batches are core-published on ``interlock.kv.<id>`` and one subscriber on
  ``interlock.kv.>`` decodes them, as a frontend does.
* ``jetstream``: the same, plus a stream ``KV`` on ``interlock.kv.>`` (file storage, max age
  ``--max-age`` s). The publisher still core-publishes (the server stores what lands on a stream
  subject), so the publisher is not the bottleneck.

The batches are real ``KVEventBatch`` objects encoded with msgspec's msgpack encoder, shaped like
the engine's at a full cache: one ``BlockStored`` of ``--hashes`` chained block hashes with their
token ids (``--hashes`` x 16 tokens), and one ``BlockRemoved`` of as many older hashes. They come
from ``--workers`` synthetic workers at ``--rate`` batches/s in total (paced) for ``--duration`` s.

Per mode: the server's CPU (seconds per second, and microseconds per message) over the window from
the first publish until the subscriber (and the stream) has every message, its RSS at the end, the
messages/s achieved, and this process's CPU (publisher + subscriber) to show whether the machine
kept up. For ``jetstream`` also: the stream's bytes (server's figure and the store directory on
disk), and the restore: a new ordered consumer reading the whole stream from the start, decoding
every batch and applying it to a fresh ``KvIndexer`` (what a replaying replica must do; skip the
index with ``--no-index``): seconds, messages/s, bytes read. Then the projection to a stream that
holds ``--max-age`` s at this rate, against the bytes a replica copy moves for the same final state
(``--workers`` x ``--blocks`` blocks at 9.2 bytes a block): the stream grows with time and event
rate, the copy with the state.

Prints a markdown table (one row per mode); ``--json PATH`` writes the figures too.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import datetime
import json
import os
import random
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

import msgspec
import nats
from nats.js.api import DeliverPolicy, StorageType, StreamConfig

from interlock.protocol import BlockRemoved, BlockStored, KVEventBatch, subjects
from interlock.runtime.nats_server import find_binary

BYTES_PER_BLOCK_COPY = 9.2
"""What the replica copy moves per indexed block (measured for the request-plane copy)."""

BLOCK_SIZE = 16
CLK_TCK = os.sysconf("SC_CLK_TCK")


# ---- the server --------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:  # in the child, between fork and exec
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Server:
    """A private nats-server with JetStream, its store in a temporary directory."""

    def __init__(self) -> None:
        self.dir = tempfile.TemporaryDirectory(prefix="interlock-jscost-")
        self.store = Path(self.dir.name) / "store"
        self.port = _free_port()
        self.monitor_port = _free_port()
        args = [str(find_binary()), "-a", "127.0.0.1", "-p", str(self.port)]
        args += ["-m", str(self.monitor_port), "-js", "-sd", str(self.store)]
        args += ["-l", str(Path(self.dir.name) / "log")]
        self.process = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        deadline = time.monotonic() + 10
        while True:
            if self.process.poll() is not None:
                self.stop()
                raise RuntimeError(f"nats-server exited with status {self.process.returncode}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("nats-server did not start within 10 s") from None
                time.sleep(0.02)

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime

    def rss_bytes(self) -> tuple[int, int]:
        """(VmRSS, VmHWM) in bytes."""
        values = {}
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0]) * 1024
        return values["VmRSS"], values["VmHWM"]

    def store_bytes(self) -> int:
        total = 0
        for root, _, files in os.walk(self.store):
            for name in files:
                try:
                    total += os.stat(os.path.join(root, name)).st_blocks * 512
                except OSError:
                    pass
        return total

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.dir.cleanup()


# ---- the synthetic workers ---------------------------------------------------------------------


class Workers:
    """Batches like the engine's at a full cache: store ``hashes`` new chained blocks (with their
    token ids), remove as many older ones."""

    def __init__(self, n: int, hashes: int, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.ids = [secrets.token_hex(8) for _ in range(n)]
        self.subjects = [subjects.kv(i) for i in self.ids]
        self.seq = [0] * n
        self.held: list[deque[int]] = [deque() for _ in range(n)]
        self.hashes = hashes
        self.encoder = msgspec.msgpack.Encoder()

    def next(self, w: int) -> tuple[str, bytes]:
        rng = self.rng
        stored = tuple(rng.getrandbits(64) for _ in range(self.hashes))
        held = self.held[w]
        removed = tuple(held.popleft() if held else rng.getrandbits(64) for _ in range(self.hashes))
        held.extend(stored)
        batch = KVEventBatch(
            instance_id=self.ids[w],
            seq=self.seq[w],
            timestamp=time.time(),
            events=(
                BlockStored(
                    block_hashes=stored,
                    parent_block_hash=rng.getrandbits(64),
                    block_size=BLOCK_SIZE,
                ),
                BlockRemoved(block_hashes=removed),
            ),
        )
        self.seq[w] += 1
        return self.subjects[w], self.encoder.encode(batch)


# ---- one mode ----------------------------------------------------------------------------------


async def _wait_for(cond, timeout: float) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def run_mode(mode: str, args: argparse.Namespace) -> dict:
    server = Server()
    try:
        return await _run_mode(mode, server, args)
    finally:
        server.stop()


async def _run_mode(mode: str, server: Server, args: argparse.Namespace) -> dict:
    decoder = msgspec.msgpack.Decoder(KVEventBatch)
    workers = Workers(args.workers, args.hashes, seed=args.seed)
    pub = await nats.connect(server.url)
    sub_nc = await nats.connect(server.url)
    js = pub.jetstream()
    if mode == "jetstream":
        await js.add_stream(
            StreamConfig(
                name="KV",
                subjects=[subjects.KV_ALL],
                storage=StorageType.FILE,
                max_age=float(args.max_age),
            )
        )
    received = 0
    received_bytes = 0

    async def on_msg(msg) -> None:  # noqa: ANN001
        nonlocal received, received_bytes
        decoder.decode(msg.data)
        received += 1
        received_bytes += len(msg.data)

    sub = await sub_nc.subscribe(subjects.KV_ALL, cb=on_msg, pending_msgs_limit=1_000_000)
    await sub_nc.flush()

    total = int(args.rate * args.duration)
    loop = asyncio.get_running_loop()
    cpu0, proc0, t0 = server.cpu_s(), time.process_time(), loop.time()
    sent = sent_bytes = 0
    w = 0
    while sent < total:
        due = min(total, int((loop.time() - t0) * args.rate) + 1)
        while sent < due:
            subject, payload = workers.next(w)
            w = (w + 1) % args.workers
            await pub.publish(subject, payload)
            sent += 1
            sent_bytes += len(payload)
        await asyncio.sleep(0.002)
    await pub.flush()
    t_pub = loop.time() - t0
    got_all = await _wait_for(lambda: received >= total, 30)
    stored_msgs = stored_bytes = 0
    if mode == "jetstream":
        for _ in range(1500):  # the stream may still be writing what the subscriber already has
            state = (await js.stream_info("KV")).state
            stored_msgs, stored_bytes = state.messages, state.bytes
            if stored_msgs >= total:
                break
            await asyncio.sleep(0.02)
    window = loop.time() - t0
    server_cpu = server.cpu_s() - cpu0
    client_cpu = time.process_time() - proc0
    rss, hwm = server.rss_bytes()
    out = {
        "mode": mode,
        "published": sent,
        "received": received,
        "all_received": got_all,
        "bytes_per_msg": sent_bytes / max(sent, 1),
        "publish_s": t_pub,
        "msgs_per_s": sent / t_pub,
        "window_s": window,
        "server_cpu_s_per_s": server_cpu / window,
        "server_cpu_us_per_msg": server_cpu / max(sent, 1) * 1e6,
        "client_cpu_s_per_s": client_cpu / window,
        "server_rss_mib": rss / 2**20,
        "server_peak_rss_mib": hwm / 2**20,
    }
    await sub.unsubscribe()
    if mode == "jetstream":
        await asyncio.sleep(0.5)  # let the store settle (block files flushed) before reading it
        out["stream_msgs"] = stored_msgs
        out["stream_bytes"] = stored_bytes
        out["store_disk_bytes"] = server.store_bytes()
        out["stream_bytes_per_msg"] = stored_bytes / max(stored_msgs, 1)
        out.update(await _restore(server, stored_msgs, workers.ids, not args.no_index))
        retained = args.rate * args.max_age
        out["retained_msgs_at_max_age"] = retained
        out["stream_bytes_at_max_age"] = retained * out["stream_bytes_per_msg"]
        out["restore_s_at_max_age"] = retained / out["restore_msgs_per_s"]
    await pub.drain()
    await sub_nc.drain()
    return out


async def _restore(server: Server, expected: int, worker_ids: list[str], use_index: bool) -> dict:
    """A new replica: an ordered consumer from the stream's start, every batch decoded (and
    applied to a fresh index)."""
    decoder = msgspec.msgpack.Decoder(KVEventBatch)
    index = None
    if use_index:
        from interlock.router.indexer import KvIndexer

        index = KvIndexer()
        for wid in worker_ids:
            index.add_worker(wid)
    nc = await nats.connect(server.url)
    js = nc.jetstream()
    n = nbytes = 0
    done = asyncio.Event()

    async def on_msg(msg) -> None:  # noqa: ANN001
        nonlocal n, nbytes
        batch = decoder.decode(msg.data)
        if index is not None:
            index.apply(batch)
        n += 1
        nbytes += len(msg.data)
        if n >= expected:
            done.set()

    proc0 = time.process_time()
    t0 = time.perf_counter()
    sub = await js.subscribe(
        subjects.KV_ALL, cb=on_msg, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL
    )
    try:
        await asyncio.wait_for(done.wait(), timeout=300)
    except TimeoutError:
        pass
    elapsed = time.perf_counter() - t0
    client_cpu = time.process_time() - proc0
    await sub.unsubscribe()
    await nc.drain()
    return {
        "restore_msgs": n,
        "restore_s": elapsed,
        "restore_msgs_per_s": n / elapsed,
        "restore_bytes_read": nbytes,
        "restore_client_cpu_s": client_cpu,
        "restore_applied_to_index": index is not None,
    }


# ---- report ------------------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        for line in subprocess.run(
            ["lscpu"], capture_output=True, text=True, check=False
        ).stdout.splitlines():
            if line.startswith("Model name:"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return "?"


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def report(args: argparse.Namespace, rows: list[dict], copy_bytes: float) -> str:
    lines = [
        f"`{' '.join(shlex.quote(a) for a in ['benchmarks/jetstream_cost.py', *sys.argv[1:]])}`",
        "",
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, {_cpu_model()}, "
        f"{os.cpu_count()} vCPU, nats-server {_server_version()}",
        "",
        "| mode | msgs/s | B/msg | server CPU (cores) | server CPU µs/msg | client CPU (cores) "
        "| server RSS (peak) | stream bytes (disk) | stream B/msg | restore | restore msgs/s "
        f"| stream at {args.max_age:g} s | restore at {args.max_age:g} s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        js = r["mode"] == "jetstream"
        lines.append(
            "| "
            + " | ".join(
                [
                    r["mode"],
                    f"{r['msgs_per_s']:.0f}" + ("" if r["all_received"] else " (lost)"),
                    f"{r['bytes_per_msg']:.0f}",
                    f"{r['server_cpu_s_per_s']:.3f}",
                    f"{r['server_cpu_us_per_msg']:.1f}",
                    f"{r['client_cpu_s_per_s']:.2f}",
                    f"{r['server_rss_mib']:.0f} MiB ({r['server_peak_rss_mib']:.0f})",
                    f"{_fmt_bytes(r['stream_bytes'])} ({_fmt_bytes(r['store_disk_bytes'])})" if js else "-",
                    f"{r['stream_bytes_per_msg']:.0f}" if js else "-",
                    f"{r['restore_msgs']} msgs, {_fmt_bytes(r['restore_bytes_read'])} in "
                    f"{r['restore_s']:.2f} s"
                    if js
                    else "-",
                    f"{r['restore_msgs_per_s']:.0f}" if js else "-",
                    f"{_fmt_bytes(r['stream_bytes_at_max_age'])}" if js else "-",
                    f"{r['restore_s_at_max_age']:.0f} s" if js else "-",
                ]
            )
            + " |"
        )
    index = "decoded and applied to a KvIndexer" if not args.no_index else "decoded only"
    lines += [
        "",
        f"Restore: a new ordered consumer reads the stream from the start, each batch {index}. "
        f"Replica copy of the same final state ({args.workers} workers x {args.blocks} blocks at "
        f"{BYTES_PER_BLOCK_COPY} B/block): {_fmt_bytes(copy_bytes)}, whatever the stream's age or "
        "the event rate.",
    ]
    return "\n".join(lines)


def _server_version() -> str:
    try:
        out = subprocess.run([str(find_binary()), "--version"], capture_output=True, text=True, check=False)
        return out.stdout.strip().rpartition(" ")[2] or "?"
    except OSError:
        return "?"


async def main(args: argparse.Namespace) -> None:
    rows = []
    for mode in args.modes.split(","):
        rows.append(await run_mode(mode.strip(), args))
    copy_bytes = args.workers * args.blocks * BYTES_PER_BLOCK_COPY
    for r in rows:
        r["replica_copy_bytes"] = copy_bytes
    print(report(args, rows, copy_bytes))
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"argv": sys.argv, "cpu": _cpu_model(), "vcpus": os.cpu_count(), "rows": rows}, indent=2
            )
        )


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=300, help="synthetic workers (one subject each)")
    p.add_argument("--rate", type=float, default=600.0, help="KV event batches per second, in total")
    p.add_argument("--duration", type=float, default=20.0, help="seconds of publishing per mode")
    p.add_argument("--hashes", type=int, default=4, help="blocks stored (and removed) per batch")
    p.add_argument("--blocks", type=int, default=4096, help="blocks per worker in the final state")
    p.add_argument("--max-age", type=float, default=3600.0, help="the stream's max age, seconds")
    p.add_argument("--modes", default="core,jetstream", help="comma-separated: core, jetstream")
    p.add_argument("--no-index", action="store_true", help="restore decodes only (no KvIndexer)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the figures here too")
    return p.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
