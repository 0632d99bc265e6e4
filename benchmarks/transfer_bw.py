"""KV-transfer bandwidth: 64 MiB of KV blocks between two processes, against raw baselines.

One run, interleaved rounds (so machine noise hits every column alike), median of ``--runs``:

* raw memcpy      numpy copy of the same bytes between two prefaulted arrays, one process
* 2 memcpys       two such copies at once on two threads (other arrays), timed until both end,
                  GB/s of one copy's bytes, so 100% of memcpy means two copies at once cost one
                  and 50% that they cost two in a row: the most that overlapping an export with
                  an import can give (on the AMD EPYC VM, about 50%: one copy takes all the
                  memory bandwidth there is)
* raw socket      ``sendall`` of the same bytes on a kept-open loopback connection into a
                  prefaulted buffer with ``recv_into``, two processes
* shm / tcp       the transfer itself: the source worker has staged the blocks (exported) and
                  published; timed on the destination from ``pull`` until the bytes are in
                  memory it owns (shm: the one copy out of the shared pages into the destination
                  cache, i.e. the import; tcp: received into its buffer) and released
* e2e shm         source KV cache -> destination KV cache on one host, as the engine does it
                  (issue 14): ONE copy, in steps of about ``--chunk-mib`` (8 MiB, the engine's):
                  ``copy_parts`` parts, one ``copy_from_shared(..., part=(k, parts))`` per step as
                  ``EngineCore.copy_remote_blocks`` / ``copy_remote_kv`` call it, each part a
                  slice of the runs (layer, k/v, head) of EVERY block, on the threads the
                  engine's rule gives (``copy_threads``: two here, torch having two). The source's
                  cache lies on a memfd (``PagedKVCache(shared=True)``); it publishes the blocks
                  with its region (``publish_blocks(cache_region=...)``) and holds them; the
                  destination maps the cache (``SharedViews``, kept per source as a worker keeps
                  it), claims the transfer DIRECT (``agent.pull_direct``), copies the blocks
                  straight into its own cache, checks the source still held them (``holding``)
                  and says DONE (``release``); timed on the destination from the request to the
                  source until DONE
* e2e shm 1 thread
                  the same on a worker with one torch thread (``copy_threads`` gives it one)
* e2e shm 2 threads (forced)
                  the same, each step on two threads whether a core is idle or not (the kernel
                  called directly: what the rule's helper gives, and costs on a busy machine)
* e2e shm one call
                  the same, the whole copy in one ``copy_from_shared`` call
* e2e shm block steps (before)
                  the same in the engine's earlier steps: some blocks whole per call (8 MiB: 22
                  SmolLM2 blocks), one thread. Each call reads each run's pieces a run stride /
                  22 blocks apart, every piece on a page of its own
* e2e shm staged / e2e tcp
                  source KV cache -> destination KV cache: export + transfer + import, timed on
                  the destination including the request to the source. Streamed, as the engine
                  does it off one host (and on one host without a shared cache): the source
                  publishes first and exports chunk by chunk (``publish_blocks``), the
                  destination imports each chunk once it is ready (``BlockImport``), so the two
                  copies overlap
* e2e shm staged seq / e2e tcp seq
                  the same, the copies in sequence (``stage_blocks``, then the import on DONE)
* one copy        the bare mechanism of "e2e shm", no transfer protocol: the destination
                  copies the blocks from the mapped cache (``copy_from_shared``); timed from the
                  request to the source until "done" is sent back

Both ends hold a real ``PagedKVCache`` of SmolLM2-135M bf16 blocks, ``--cache-gib`` each (default
1 GiB, a worker's default ``CacheConfig.kv_cache_gib``: ~2,900 blocks), and copy ``--mib`` of
scattered block ids (as after churn) with the engine's own calls: ``stage_blocks`` (export
straight into the staged payload) and ``import_when_done`` (import straight from it), through
the block-copy kernel. The cache's size matters: a block is 180 pieces of 2 KiB, each a run
stride (num_blocks x 2 KiB) apart, so the larger the cache the sparser the pieces and the
costlier the page walks (the source's shared cache is on 4 KiB pages where shmem gets no huge
pages, as on the AMD EPYC VM; the private caches on huge pages). Each cache is filled once
per process.

GB/s is 1e9 bytes per second. Usage:
``python benchmarks/transfer_bw.py [--runs 7] [--mib 64] [--cache-gib 1] [--chunk-mib 8] [--phases]``
(``--phases``: also print where the time of a sequential e2e shm staged transfer goes).
"""

from __future__ import annotations

import argparse
import array
import multiprocessing as mp
import os
import platform
import socket
import statistics
import threading
import time
from multiprocessing.connection import Connection

import msgspec
import numpy as np

from interlock.engine.config import CacheConfig
from interlock.engine.model.kv_cache import PagedKVCache, SharedCacheView
from interlock.engine.shared_cache import SharedViews, copy_parts, part_range
from interlock.protocol.transfer import TransferDescriptor
from interlock.transfer import (
    BlockImport,
    TransferAgent,
    TransferState,
    import_when_done,
    publish_blocks,
)
from interlock.transfer.kv import CHUNK_BYTES

BLOCK_NBYTES = 30 * 2 * 3 * 64 * 16 * 2
"""One SmolLM2-135M KV block in bf16: 30 layers x (K, V) x 3 KV heads x 64 dims x 16 tokens."""


class _Copier:
    """A runner's side of the copies (``TorchRunner`` delegates to its cache the same way):
    ``nblocks`` scattered blocks of a cache of ``cache_blocks``."""

    def __init__(self, nblocks: int, cache_blocks: int, seed: int, *, shared: bool = False) -> None:
        import torch

        from interlock.engine.model.config import ModelArchConfig
        from interlock.model_store import resolve_model

        arch = ModelArchConfig.from_folder(resolve_model("smollm2", progress=False))
        self.cache = PagedKVCache(arch, cache_blocks, 16, torch.bfloat16, torch.device("cpu"), shared=shared)
        assert self.cache.block_nbytes == BLOCK_NBYTES
        gen = torch.Generator().manual_seed(seed)
        self.cache.tensor.view(torch.int16).random_(generator=gen)  # in place: no 2x temporary
        self.kv_block_nbytes = BLOCK_NBYTES
        self.export_blocks = self.cache.export_blocks
        self.import_blocks = self.cache.import_blocks
        rng = np.random.default_rng(seed)
        self.block_ids = [int(b) for b in rng.permutation(cache_blocks)[:nblocks]]


def source_process(conn: Connection, nbytes: int, cache_blocks: int, chunk_bytes: int) -> None:
    kv = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    copier = _Copier(nbytes // BLOCK_NBYTES, cache_blocks, seed=0)
    shared = _Copier(nbytes // BLOCK_NBYTES, cache_blocks, seed=2, shared=True)
    with TransferAgent() as agent, socket.create_server(("127.0.0.1", 0)) as raw_server:
        conn.send(raw_server.getsockname()[1])
        raw, _ = raw_server.accept()
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sources = []
        while (cmd := conn.recv()) != "exit":
            if cmd == "raw":
                raw.recv(1)
                raw.sendall(memoryview(kv))
                continue
            if cmd == "onecopy":  # offer the blocks where they lie; hold them until DONE
                conn.send((shared.cache.shared_region(), shared.block_ids))
                if conn.recv() != "done":
                    raise RuntimeError("one-copy transfer not done")
                continue
            if cmd == "direct":  # as KVHandoff: publish with the region, hold until it ends
                src, desc, _ = publish_blocks(
                    agent, shared, shared.block_ids, cache_region=shared.cache.shared_region()
                )
                conn.send((msgspec.msgpack.encode(desc), shared.block_ids))
                while not src.poll().finished:  # polled, as the worker's handoff polls
                    time.sleep(0.002)
                if src.claim_kind() != "direct" or src.poll().state is not TransferState.DONE:
                    raise RuntimeError(f"one-copy transfer not done: {src.poll().reason}")
                conn.send("ended")  # after the clock: the next path starts on a quiet source
                continue
            t = [time.perf_counter()]
            if cmd == "stream":  # the descriptor leaves first, then the export, chunk by chunk
                src, desc, export = publish_blocks(agent, copier, copier.block_ids, chunk_bytes=chunk_bytes)
                conn.send(msgspec.msgpack.encode(desc))
                export.run()
            else:
                src = agent.create_source(nbytes)
                t.append(time.perf_counter())
                copier.export_blocks(copier.block_ids, src.buffer)  # the source's one copy
                t.append(time.perf_counter())
                desc = src.publish()
                t.append(time.perf_counter())
                conn.send((msgspec.msgpack.encode(desc), t))
            sources.append(src)
            sources = [s for s in sources if not s.poll().finished]
        raw.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument(
        "--cache-gib",
        type=float,
        default=CacheConfig.kv_cache_gib,
        help="each end's KV cache, GiB (default: a worker's default)",
    )
    ap.add_argument(
        "--chunk-mib",
        type=float,
        default=CHUNK_BYTES / (1 << 20),
        help="streamed export chunk (the engine's)",
    )
    ap.add_argument("--phases", action="store_true", help="time each phase of a sequential e2e shm")
    args = ap.parse_args()
    nblocks = max(1, (args.mib << 20) // BLOCK_NBYTES)
    nbytes = nblocks * BLOCK_NBYTES
    cache_blocks = int(args.cache_gib * (1 << 30)) // BLOCK_NBYTES  # as blocks_for_budget
    if cache_blocks < nblocks:
        ap.error(f"--cache-gib {args.cache_gib} holds {cache_blocks} blocks, fewer than the {nblocks} copied")
    ctx = mp.get_context("spawn")
    conn, child_conn = ctx.Pipe()
    chunk_bytes = int(args.chunk_mib * (1 << 20))
    child = ctx.Process(
        target=source_process, args=(child_conn, nbytes, cache_blocks, chunk_bytes), daemon=True
    )
    child.start()
    phases: dict[str, list[float]] = {}
    try:
        times, longest = run_all(
            conn, nbytes, cache_blocks, chunk_bytes, args.runs, phases if args.phases else None
        )
    finally:
        conn.send("exit")
        child.join(10)
        if child.is_alive():
            child.kill()
    report(times, nbytes, nblocks, cache_blocks, args.runs, chunk_bytes)
    print("\nLongest step of the one copy (one engine call; the other requests' steps wait), ms:")
    for row, v in longest.items():
        print(f"  {row:30s} median {statistics.median(v) * 1e3:6.2f}, max {max(v) * 1e3:6.2f}")
    if phases:
        print(
            "\nPhases of a sequential e2e shm staged transfer (median ms, perf_counter is one clock across processes):"
        )
        for k, v in phases.items():
            print(f"  {k:28s} {statistics.median(v) * 1e3:7.3f}")


def run_all(
    conn: Connection,
    nbytes: int,
    cache_blocks: int,
    chunk_bytes: int,
    runs: int,
    phases: dict[str, list[float]] | None,
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """(seconds per path and round, the longest step per one-copy path and round)."""
    raw = socket.create_connection(("127.0.0.1", conn.recv()))
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    kv_src = np.random.default_rng(1).integers(0, 255, nbytes, dtype=np.uint8)
    kv_dst = np.ones(nbytes, np.uint8)
    pairs = [(np.full(nbytes, k + 2, np.uint8), np.ones(nbytes, np.uint8)) for k in range(2)]
    copier = _Copier(nbytes // BLOCK_NBYTES, cache_blocks, seed=1)
    sink = memoryview(bytearray(b"\1" * nbytes))
    paths = (
        "memcpy",
        "2 memcpys",
        "socket",
        "shm",
        "tcp",
        "e2e shm",
        "e2e shm 1 thread",
        "e2e shm 2 threads (forced)",
        "e2e shm one call",
        "e2e shm block steps (before)",
        "e2e shm staged",
        "e2e tcp",
        "e2e shm staged seq",
        "e2e tcp seq",
        "one copy",
    )
    views: dict[object, SharedCacheView] = {}
    shared_views = SharedViews()
    times: dict[str, list[float]] = {k: [] for k in paths}
    longest: dict[str, list[float]] = {}  # the longest step of each one-copy row, per round
    with TransferAgent() as agent:
        for i in range(runs + 1):  # the first round warms up and is dropped

            def steps_of(row: str, i: int = i) -> list[float] | None:
                return longest.setdefault(row, []) if i else None

            sample = {
                "memcpy": _timed(lambda: np.copyto(kv_dst, kv_src)),
                "2 memcpys": _two_copies(pairs),
                "socket": _raw_socket(conn, raw, sink),
                "shm": _transfer(conn, agent, "shm", copier, staged=True),
                "tcp": _transfer(conn, agent, "tcp", copier, staged=True),
                "e2e shm": _direct(
                    conn, agent, copier, shared_views, "parts", chunk_bytes, longest=steps_of("e2e shm")
                ),
                "e2e shm 1 thread": _direct(
                    conn,
                    agent,
                    copier,
                    shared_views,
                    "parts",
                    chunk_bytes,
                    threads=1,
                    longest=steps_of("e2e shm 1 thread"),
                ),
                "e2e shm 2 threads (forced)": _direct(
                    conn,
                    agent,
                    copier,
                    shared_views,
                    "forced",
                    chunk_bytes,
                    longest=steps_of("e2e shm 2 threads (forced)"),
                ),
                "e2e shm one call": _direct(conn, agent, copier, shared_views, "parts", nbytes),
                "e2e shm block steps (before)": _direct(
                    conn,
                    agent,
                    copier,
                    shared_views,
                    "blocks",
                    chunk_bytes,
                    threads=1,
                    longest=steps_of("e2e shm block steps (before)"),
                ),
                "e2e shm staged": _streamed(conn, agent, "shm", copier),
                "e2e tcp": _streamed(conn, agent, "tcp", copier),
                "e2e shm staged seq": _transfer(
                    conn, agent, "shm", copier, staged=False, phases=phases if i else None
                ),
                "e2e tcp seq": _transfer(conn, agent, "tcp", copier, staged=False),
                "one copy": _one_copy(conn, copier, views),
            }
            if i:
                for k, v in sample.items():
                    times[k].append(v)
    raw.close()
    for view in views.values():
        view.close()
    return times, longest


def _timed(fn) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _two_copies(pairs: list[tuple[np.ndarray, np.ndarray]]) -> float:
    threads = [threading.Thread(target=np.copyto, args=(d, s)) for s, d in pairs]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


def _raw_socket(conn: Connection, raw: socket.socket, sink: memoryview) -> float:
    conn.send("raw")
    t0 = time.perf_counter()
    raw.sendall(b"g")
    got = 0
    while got < len(sink):
        got += raw.recv_into(sink[got:])
    return time.perf_counter() - t0


def _streamed(conn: Connection, agent: TransferAgent, transport: str, copier: _Copier) -> float:
    t0 = time.perf_counter()
    conn.send("stream")
    desc = msgspec.msgpack.decode(conn.recv(), type=TransferDescriptor)
    dst = agent.pull(desc, transport=transport, timeout_s=30)
    status = BlockImport(dst, copier, copier.block_ids).wait(30)  # each chunk once it is ready
    if status.state is not TransferState.DONE:
        raise RuntimeError(f"{transport} transfer failed: {status.reason}")
    return time.perf_counter() - t0


def _direct(
    conn: Connection,
    agent: TransferAgent,
    copier: _Copier,
    views: SharedViews,
    steps: str,
    step_bytes: int,
    *,
    threads: int = 0,
    longest: list[float] | None = None,
) -> float:
    """The one copy in steps of about ``step_bytes``: ``"parts"`` as the engine steps
    (``copy_parts`` parts of every block), ``"forced"`` the same on two threads whatever
    ``copy_threads`` says, ``"blocks"`` some blocks whole per step (the engine's earlier
    steps); ``threads``: torch's threads meanwhile (0: as they are), which ``copy_threads``
    bounds the copy's by. ``longest``: gets the longest step's seconds (an engine call's, during
    which the other requests' steps wait)."""
    import torch

    t0 = time.perf_counter()
    conn.send("direct")
    encoded, src_ids = conn.recv()
    desc = msgspec.msgpack.decode(encoded, type=TransferDescriptor)
    assert desc.cache_region is not None
    view = views.get(desc.cache_region)
    dst = agent.pull_direct(desc, timeout_s=30)
    n, ids = len(src_ids), copier.block_ids
    had = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    worst = 0.0
    try:
        parts = copy_parts(n * BLOCK_NBYTES, step_bytes)
        step = max(1, step_bytes // BLOCK_NBYTES)
        for k in range(parts if steps != "blocks" else -(-n // step)):
            t = time.perf_counter()
            if steps == "parts":
                copier.cache.copy_from_shared(view, src_ids, ids, (k, parts))
            elif steps == "forced":
                _forced_two_threads(copier.cache, view, src_ids, ids, (k, parts))
            else:
                copier.cache.copy_from_shared(
                    view, src_ids[k * step : (k + 1) * step], ids[k * step : (k + 1) * step]
                )
            worst = max(worst, time.perf_counter() - t)
    finally:
        torch.set_num_threads(had)
    if longest is not None:
        longest.append(worst)
    if not dst.holding():
        raise RuntimeError(f"one-copy transfer failed: {dst.poll().reason}")
    dst.release()
    elapsed = time.perf_counter() - t0
    if conn.recv() != "ended":
        raise RuntimeError("the source did not see DONE")
    return elapsed


def _forced_two_threads(
    cache: PagedKVCache, view: SharedCacheView, src_ids: list[int], ids: list[int], part: tuple[int, int]
) -> None:
    """``copy_from_shared`` of ``part``, the kernel called directly with two threads (its
    private geometry read here only)."""
    kernel, runs = cache._kernel, cache._pieces
    assert kernel is not None
    sids, dids = array.array("q", src_ids), array.array("q", ids)
    r0, r1 = part_range(part, runs)
    bad = kernel.between(
        view.address, view.region.num_blocks, sids.buffer_info()[0], cache._base, cache.num_blocks,
        cache._piece, runs, dids.buffer_info()[0], len(ids), r0, r1, 2,
    )  # fmt: skip
    assert bad < 0, bad


def _one_copy(conn: Connection, copier: _Copier, views: dict[object, SharedCacheView]) -> float:
    t0 = time.perf_counter()
    conn.send("onecopy")
    region, src_ids = conn.recv()
    if region not in views:
        views[region] = SharedCacheView(region)
    copier.cache.copy_from_shared(views[region], src_ids, copier.block_ids)
    conn.send("done")
    return time.perf_counter() - t0


def _transfer(
    conn: Connection,
    agent: TransferAgent,
    transport: str,
    copier: _Copier,
    *,
    staged: bool,
    phases: dict[str, list[float]] | None = None,
) -> float:
    t0 = time.perf_counter()
    conn.send("offer")
    encoded, t_src = conn.recv()
    t_reply = time.perf_counter()
    desc = msgspec.msgpack.decode(encoded, type=TransferDescriptor)
    if staged:
        t0 = time.perf_counter()
    dst = agent.pull(desc, transport=transport, timeout_s=30)
    t_pulled = time.perf_counter()
    dst.finished_event.wait(30)
    if dst.poll().state is not TransferState.DONE:
        raise RuntimeError(f"{transport} transfer failed: {dst.poll().reason}")
    elapsed = time.perf_counter() - t0  # tcp: received into memory the destination owns
    t_done = time.perf_counter()
    import_when_done(dst, copier, copier.block_ids)  # the import (and release)
    t_end = time.perf_counter()
    if not (staged and transport == "tcp"):
        elapsed = t_end - t0
    if phases is not None:
        marks = [t0, *t_src, t_reply, t_pulled, t_done, t_end]
        names = ("request to the source", "take a staging buffer", "export", "publish", "reply",
                 "pull (attach, claim)", "wait for DONE", "import and release")  # fmt: skip
        for name, a, b in zip(names, marks[:-1], marks[1:], strict=True):
            phases.setdefault(name, []).append(b - a)
        phases.setdefault("total", []).append(t_end - t0)
    return elapsed


def report(
    times: dict[str, list[float]], nbytes: int, nblocks: int, cache_blocks: int, runs: int, chunk_bytes: int
) -> None:
    """Ratios two ways: of the medians, and the median of per-round ratios (each round runs every
    path back to back, so the paired figure is steadier when the machine's load swings)."""
    gbps = {k: nbytes / statistics.median(v) / 1e9 for k, v in times.items()}
    raw_of = {"shm": "memcpy", "tcp": "socket", "e2e shm": "memcpy", "e2e tcp": "socket"}
    raw_of |= {"e2e shm staged": "memcpy", "e2e shm staged seq": "memcpy", "e2e tcp seq": "socket"}
    raw_of |= {"2 memcpys": "memcpy", "e2e shm one call": "memcpy", "e2e shm block steps (before)": "memcpy"}
    raw_of |= {"e2e shm 1 thread": "memcpy", "e2e shm 2 threads (forced)": "memcpy"}
    raw_of |= {"one copy": "memcpy"}
    print(
        f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.node()}, "
        f"Python {platform.python_version()}, load {os.getloadavg()[0]:.1f}, "
        f"{nblocks} blocks x {BLOCK_NBYTES} B = {nbytes / 2**20:.1f} MiB scattered in a KV cache of "
        f"{cache_blocks} blocks = {cache_blocks * BLOCK_NBYTES / 2**30:.2f} GiB per end, median of {runs}, "
        f"streamed and one copy in steps of {chunk_bytes / 2**20:g} MiB"
    )
    print(
        "| path | GB/s (median) | min..max GB/s | vs raw (ratio of medians) | vs raw (median paired ratio) |"
    )
    print("|---|---|---|---|---|")
    for k, v in times.items():
        lo, hi = nbytes / max(v) / 1e9, nbytes / min(v) / 1e9
        ratios = ["", ""]
        if k in raw_of:
            raw = raw_of[k]
            paired = statistics.median(r / t for r, t in zip(times[raw], v, strict=True))
            ratios = [f"{gbps[k] / gbps[raw]:.0%} of raw {raw}", f"{paired:.0%}"]
        print(f"| {k} | {gbps[k]:.2f} | {lo:.2f}..{hi:.2f} | {ratios[0]} | {ratios[1]} |")


if __name__ == "__main__":
    main()
